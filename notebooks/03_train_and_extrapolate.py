# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% tags=["colab"]
# On Colab, or in any Python without minidape, this cell installs it; elsewhere it does nothing. The torch already
# installed (Colab's CUDA build) is kept. QUICK_MODE = True, set before you run the notebook, runs it in quick
# mode: fewer training steps and shorter lengths, the same code.
QUICK_MODE = False
MINIDAPE_SOURCE = "minidape"  # what pip installs: minidape from the package index, or its wheel's URL or path

import importlib.metadata, importlib.util, os, subprocess, sys  # noqa: E401

if QUICK_MODE:
    os.environ["MINIDAPE_QUICK"] = "1"
if importlib.util.find_spec("minidape") is None:
    keep_torch = [f"torch=={importlib.metadata.version('torch')}"] if importlib.util.find_spec("torch") else []
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", MINIDAPE_SOURCE, *keep_torch])
    if pip.returncode != 0:
        raise RuntimeError(f"pip could not install minidape from {MINIDAPE_SOURCE!r}: set MINIDAPE_SOURCE to its wheel")
    importlib.invalidate_caches()

# %% [markdown]
# # 03 · Train, then extrapolate: perplexity beyond the training length
#
# Notebooks 01 and 02 looked at positional encodings (PEs) on paper. Here we **train** small language models
# with several of them on the books corpus (Jane Austen's six novels, byte-level) at a training length of
# $L = 64$ tokens, and then ask each one to read sequences up to $16L$.
#
# Three measurements, all from `md.evaluate`:
#
# 1. **Extrapolation curves**: perplexity against evaluation length (`perplexity_by_length`).
# 2. **Two evaluation protocols** side by side, `last_k` (DAPE's) and `nonoverlap` (ALiBi's and Kerple's),
#    and why the same model gets different numbers from them (DAPE paper, §5).
# 3. **Position-wise loss** (Kerple's position-wise perplexity, `loss_by_position`): the loss at each
#    position of a long window, which shows *where* a model stops working.
#
# **A word on budget.** The papers train 125M-parameter models for 50k steps on GPUs. Everything below is a
# ~0.1M-parameter model trained for a few hundred steps on a shared 2-core CPU, so the absolute perplexities
# are high and differences of a few percent are noise. What these tiny runs do show reliably is the
# *qualitative* picture: which encodings break beyond the training length and which do not.
#
# **Cost.** Trains six models (2 layers, 64 wide, 400 steps of 16 × 64 bytes each). Full mode takes about
# 2 min (146 s measured on a 2-core AMD EPYC CPU shared with other jobs); on a GPU the
# same budget runs in a fraction of that (raise `STEPS` and `BATCH` there for smoother curves).
#
# **Exercises:** 3.1 predict, then measure, how far RoPE degrades at 16× (experiment, 2 points: the measurement
# and the prediction), with a written answer; 3.2 derive both protocols' perplexities from one position-wise
# loss curve (2); 3.3 implement a running mean that does not invent values before position 0 (2).

# %%
import math
import textwrap
import time
import warnings

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import minidape as md
from minidape import exercises, notebook

RUN = notebook.start()       # seeds torch, one CPU thread (tiny models), the clock of the run time printed at the end
QUICK = RUN.quick            # MINIDAPE_QUICK=1 (CI): fewer steps and lengths, the same code

BUDGET = notebook.books_budget(QUICK)   # the budget notebooks 03-06 share: print(BUDGET) or see its fields
TRAIN_LENGTH, STEPS, BATCH, LR = BUDGET.train_length, BUDGET.steps, BUDGET.batch, BUDGET.lr
LENGTHS, EVAL_WINDOWS, VAL_WINDOWS = BUDGET.lengths, BUDGET.eval_windows, BUDGET.val_windows
SCORED = min(256, min(LENGTHS))                     # tokens last_k scores, the same at every length
NONOVERLAP_TOKENS = 1024 if QUICK else 16384        # stretch of validation text scored by nonoverlap
LONGEST = LENGTHS[-1]


def config(pe, **overrides):
    """The model of this notebook: 2 layers, 4 heads of size 16 (~0.1M parameters plus the byte embeddings)."""
    settings = dict(n_layer=2, n_head=4, n_embd=64, block_size=TRAIN_LENGTH, pe=pe)
    return md.GPTConfig(**{**settings, **overrides})


print(RUN, "|", BUDGET)

# %%
# DEVICE: every model and tensor of this notebook lives here: CUDA if there is a GPU, then Apple's MPS, then the CPU.
DEVICE = notebook.device()
print("device:", DEVICE)

# %% [markdown]
# ## 1. The data
#
# `md.load_corpus` returns the corpus as bytes (vocabulary 256, no tokenizer): the first 90% is the `train`
# split, the last 10% the `val` split. Every evaluation below reads fixed, seeded windows of `val`, so the
# curves of different models are measured on exactly the same text.

# %%
# NBVAL_CHECK_OUTPUT
train_tokens = md.load_corpus("austen", "train")
val_tokens = md.load_corpus("austen", "val")
print(f"train: {len(train_tokens):,} bytes   val: {len(val_tokens):,} bytes")
print(repr(bytes(val_tokens[1000:1100].tolist()).decode("utf-8", errors="replace")))

# %% [markdown]
# ## 2. Train one model per positional encoding
#
# Six encodings, one of each family of notebook 01:
#
# | `pe` | what it is |
# |---|---|
# | `learned` | GPT-2's table of $L$ position vectors (it has no row 64: it cannot run beyond $L$) |
# | `none` | NoPE: only the causal mask tells order |
# | `rope` | rotary queries/keys (Su et al.) |
# | `alibi` | fixed linear bias $-m_h (i-j)$ (Press et al.) |
# | `kerple_log` | learned log bias $-r_1 \ln(1 + r_2 (i-j))$ (Chi et al.) |
# | `fire` | learned MLP of a normalised distance (Li et al.) |
#
# `md.train` uses AdamW with warmup and cosine decay; every model sees the same batches (same seed). The
# history it returns holds the training loss of each logged step and a validation loss every few steps.
#
# ### Exercise 3.1 (experiment), part 1 · Predict before you train
#
# At $16L$ = 1024 tokens, will RoPE's `last_k` perplexity be **more than twice** its perplexity at the training
# length? Write your prediction (`True` or `False`) *now*, before the models are trained; part 2 measures it.

# %% tags=["prediction"]
rope_breaks = None                        # your prediction: True or False


# %% tags=["solution", "prediction"]
rope_breaks = True                        # unseen rotation angles: RoPE should break well beyond L

# %%
PES = ["learned", "none", "rope", "alibi", "kerple_log", "fire"]
models, histories, train_seconds = {}, {}, {}
for pe in PES:
    start = time.perf_counter()
    models[pe], histories[pe] = md.train(config(pe), train_tokens, val_data=val_tokens, steps=STEPS,
                                         batch_size=BATCH, lr=LR, eval_every=max(4, STEPS // 8),
                                         eval_windows=VAL_WINDOWS, seed=0, progress=False, device=DEVICE)
    train_seconds[pe] = time.perf_counter() - start
    print(f"{pe:<11} final validation loss {histories[pe][-1]['val_loss']:.3f} nats   "
          f"({models[pe].num_params():,} parameters, {train_seconds[pe]:.0f} s)")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for pe, history in histories.items():
    logged = [entry for entry in history if "val_loss" in entry]
    ax.plot([e["step"] for e in logged], [e["val_loss"] for e in logged], marker="o", markersize=3, label=pe,
            **md.plots.model_style(pe))
ax.set_xlabel("training step")
ax.set_ylabel("validation loss at length 64 (nats)")
ax.set_title("Learning curves: at the training length every encoding learns")
ax.grid(alpha=0.3)
ax.legend(fontsize="small")
plt.show()

# %% [markdown]
# At the training length the encodings are close to each other: inside the lengths it was trained on, any
# reasonable PE lets the model learn the language. The interesting part is what happens *past* $L$.
#
# ## 3. Extrapolation curves (`last_k`, DAPE's protocol)
#
# `perplexity_by_length(..., protocol="last_k")` scores the **same tokens at every length**: `EVAL_WINDOWS`
# disjoint stretches of $k = \min(256, \text{shortest length})$ tokens ($k = 64$ here), placed once over the
# validation split. At length $T$ the model reads the $T$ tokens that end at each stretch, and only the
# stretch's $k$ predictions (the **last** $k$ of the window) are scored:
#
# $$\mathrm{ppl}_{\text{last-}k}(T) = \exp\Big(-\frac{1}{Nk}\sum_{\text{windows}}\ \sum_{t=T-k}^{T-1}
#   \ln p(x_{t+1} \mid x_{\le t})\Big).$$
#
# Every length is judged on the same tokens, only their context grows, and every scored token sits at position
# $\ge T - k$, far beyond $L$ once $T \gg L$: a rise from one length to the next is the model's, not the text's. `learned` cannot run beyond its table: the function reports NaN there
# (with a warning, silenced here) and the plot leaves those points out.

# %% tags=["reveals-prediction"]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")     # "length ... skipped (reported as NaN)" for pe="learned"
    last_k = {pe: md.evaluate.perplexity_by_length(model, val_tokens, LENGTHS, protocol="last_k",
                                                   n_windows=EVAL_WINDOWS)
              for pe, model in models.items()}
# Quick mode trains 8 steps: every curve is flat. The teacher's full-mode run is drawn beside it (stored with
# minidape); the text below reads that one.
reference_last_k = notebook.reference("03/last_k", last_k)
notebook.beside_reference(md.plots.plot_extrapolation, last_k, reference_last_k, train_length=TRAIN_LENGTH,
                          title=f"Perplexity of the same {SCORED} scored tokens at every length (last_k)")
plt.show()
display(Markdown(md.plots.markdown_table(last_k, train_length=TRAIN_LENGTH)))


def growth_summary(curves, who):
    """Each model's perplexity at the longest length over that at the training length, printed and returned."""
    at_train = {pe: curve[TRAIN_LENGTH] for pe, curve in curves.items()}
    longest = max(next(iter(curves.values())))
    growth = {pe: curve[longest] / curve[TRAIN_LENGTH] for pe, curve in curves.items() if pe != "learned"}
    print(f"{who}: at the training length best {min(at_train, key=at_train.get)}, worst "
          f"{max(at_train, key=at_train.get)}; perplexity at {longest} / at {TRAIN_LENGTH}: "
          + ", ".join(f"{pe} {g:.2f}x" for pe, g in growth.items()))
    return growth


growth = growth_summary(last_k, "your run")
shown = last_k if not QUICK else reference_last_k      # the run the text below describes
if QUICK and shown is not None:
    display(Markdown("**Teacher's reference** (full mode, 400 steps):\n\n"
                     + md.plots.markdown_table(shown, train_length=TRAIN_LENGTH)))
    growth = growth_summary(shown, "teacher's reference")
if shown is not None:   # the claims of the text below, checked on the run it describes
    assert growth["rope"] > 2, "RoPE at 16x the training length should be more than twice its in-length perplexity"
    assert max(growth["alibi"], growth["kerple_log"]) < 1.25, "ALiBi and Kerple should stay nearly flat"
    assert growth["rope"] > max(growth["alibi"], growth["kerple_log"], growth["none"])

# %% [markdown]
# ### Exercise 3.1 (experiment), part 2 · Measure
#
# Set `rope_ratio` to RoPE's perplexity at `LONGEST` divided by its perplexity at `TRAIN_LENGTH`, read from the
# `last_k` results above. The check tells you whether your prediction held.

# %%
rope_ratio = None                         # your measurement, from last_k


# %% tags=["solution"]
rope_ratio = last_k["rope"][LONGEST] / last_k["rope"][TRAIN_LENGTH]


# %%
exercises.check("rope_ratio", rope_breaks, rope_ratio, last_k, TRAIN_LENGTH, LONGEST)

# %% [markdown] tags=["written", "rubric:rope_ratio"]
# **Your answer** (two or three sentences): why does RoPE degrade beyond the training length while ALiBi and
# Kerple stay nearly flat? Use the numbers of your own run (and say if quick mode trained too little to show it).

# %% [markdown] tags=["solution"]
# **Worked answer.** Beyond $L$ the slow rotary pairs turn through angles $m\theta_i$ never seen in training, so
# the query-key scores the model learned no longer mean what they did: RoPE's perplexity at $16L$ is several
# times its in-length value in full mode. ALiBi and Kerple add a bias that keeps decaying with distance, so a
# long input looks to each query like a short one (notebook 01, exercise 1.4); their curves stay flat. In fast
# mode (8 steps) no model has learned enough for the difference to show: all ratios are near 1.

# %% [markdown]
# **What to look for** (in quick mode, in the teacher's reference on the right: 8 steps teach no model enough to
# show any of this). At the training length (dashed line) the models differ by how well they learned in
# 400 steps (the line under the plot names the best and the worst). To the right:
#
# - `learned` stops: there is no embedding for position 64.
# - `rope` is among the best models at $T = L$ and breaks at $16L$ (the printed ratio; in full mode the cell
#   asserts that it more than doubles): it meets rotation angles it never saw.
# - `none` (NoPE) drifts up slowly: its implicit position signal (the causal mask lets a layer count how many
#   tokens it averages over) changes as the window grows.
# - `alibi` and `kerple_log` stay nearly flat (the printed ratios; asserted below 1.25 in full mode): their
#   bias only *penalises* distance, so far-away tokens get so little attention that a long window looks much
#   like a short one to each query.
# - `fire` normalises distances by $\psi(\max(L, i))$, so its inputs stay in $[0, 1]$ at every length; the
#   distribution of those inputs still changes, and in a short run like this one its perplexity can grow
#   beyond a few training lengths.
#
# ## 4. Two protocols, two sets of numbers (DAPE §5)
#
# The Kerple and ALiBi papers report `nonoverlap` perplexity: cut the text into consecutive windows of $T$
# tokens and score **every** prediction in each window. DAPE (§5, "Evaluation Protocol") points out that
# this gives different, usually lower, numbers than its own `last_k`, and recommends `last_k`. We run both
# on the same models.

# %% tags=["reveals-prediction"]
nonoverlap = {}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for pe, model in models.items():
        nonoverlap[pe] = md.evaluate.perplexity_by_length(model, val_tokens, LENGTHS, protocol="nonoverlap",
                                                          n_tokens=NONOVERLAP_TOKENS)

fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
md.plots.plot_extrapolation(last_k, TRAIN_LENGTH, ax=axes[0], title=f"last_k: the same {SCORED} tokens at every length")
md.plots.plot_extrapolation(nonoverlap, TRAIN_LENGTH, ax=axes[1],
                            title="nonoverlap: score every token of each window")
fig.suptitle("The same six models under the two evaluation protocols")
plt.show()

print(f"{'pe':<11}" + "".join(f"{'T=' + str(T):>18}" for T in LENGTHS))
print(f"{'':<11}" + "".join(f"{'last_k / nonovl':>18}" for _ in LENGTHS))
for pe in PES:
    cells = "".join(f"{last_k[pe][T]:>9.2f} /{nonoverlap[pe][T]:>7.2f}" for T in LENGTHS)
    print(f"{pe:<11}{cells}")

# %% [markdown]
# Two effects pull the protocols apart, in opposite directions:
#
# 1. **Short contexts inside each window.** `nonoverlap` scores the first tokens of every window, which
#    see almost no context and are hard to predict. At $T = k$ (64 here) the two protocols score the same
#    positions (whole windows) and differ only in which text they read (`last_k` its stretches, `nonoverlap`
#    the first `NONOVERLAP_TOKENS` tokens): the table shows close numbers there. Beyond, every token `last_k`
#    scores has at least $T - k$ tokens of context, so a model that can *use* long context comes out better
#    under `last_k`. Our tiny models gain little from
#    context beyond a few dozen bytes, so this effect is small here.
# 2. **Most scored tokens are near the start.** For a model that breaks beyond $L$, `nonoverlap` at
#    $T = 16L$ still scores the first $L$ positions of each window, where the model works fine, and averages
#    them with the broken ones; `last_k` scores only positions $T - k \ldots T - 1$, all far beyond $L$.
#    So failures look milder under `nonoverlap`, which is DAPE's point in §5 (and one reason why the ALiBi
#    and Kerple papers, both "non-overlapping", still report very different numbers for the same baseline).
#
# ### One curve, two averages
#
# Both protocols are averages of the same quantity: the loss $\ell_t$ of predicting token $t+1$ from tokens
# $0..t$. Because the model is causal, the first $T$ positions of a long window *are* a window of length
# $T$, so one position-wise curve measured at the longest length contains every shorter evaluation.
#
# ### Exercise 3.2 (derive) · Both protocols from one curve
#
# Write `protocols_from_curve(curve, T, k)`: from a position-wise loss curve (a 1-D tensor, entry $t$ = loss
# $\ell_t$) return the pair `(last_k perplexity, nonoverlap perplexity)` at length $T$: derive from the two
# protocols' definitions (sections 3 and 4) which entries of the curve each one averages, and how. The check
# draws new random curves, lengths $T$ up to the curve's length and $k$ from 1 to $T$ (as in this notebook, where
# $k$ is at most the shortest length) each time it runs.

# %%
def protocols_from_curve(curve, T, k):
    """(last_k perplexity, nonoverlap perplexity) at length T from a position-wise loss curve."""
    exercises.todo()                      # your code here


# %% tags=["solution"]
def protocols_from_curve(curve, T, k):
    """(last_k perplexity, nonoverlap perplexity) at length T from a position-wise loss curve."""
    k = min(k, T)
    return math.exp(curve[T - k:T].mean()), math.exp(curve[:T].mean())


# %%
exercises.check("protocols_from_curve", protocols_from_curve)

# %% [markdown] tags=["solution"]
# The two formulas (approximately equal to the measured protocols, because the windows are drawn from different
# places of the validation text):
#
# $$\mathrm{ppl}_{\text{nonoverlap}}(T) \approx \exp\Big(\frac1T \sum_{t=0}^{T-1} \ell_t\Big), \qquad
#   \mathrm{ppl}_{\text{last-}k}(T) \approx \exp\Big(\frac1k \sum_{t=T-k}^{T-1} \ell_t\Big),\quad k = \min(k, T).$$

# %% [markdown]
# Now the real curves: `md.evaluate.loss_by_position` for every model at `LONGEST`, and the two reconstructions
# for RoPE and ALiBi next to the measured numbers.

# %%
position_loss = {pe: md.evaluate.loss_by_position(model, val_tokens, LONGEST, n_windows=EVAL_WINDOWS).cpu()
                 for pe, model in models.items() if pe != "learned"}   # learned cannot run at LONGEST

print(f"{'pe':<7}{'T':>6}  {'last_k':>8} {'from curve':>10}   {'nonoverlap':>10} {'from curve':>10}")
for pe in ["rope", "alibi"]:
    curve = position_loss[pe]
    for T in LENGTHS:
        predicted_last_k = math.exp(curve[T - SCORED:T].mean())   # the last SCORED positions of the window
        predicted_nonoverlap = math.exp(curve[:T].mean())
        print(f"{pe:<7}{T:>6}  {last_k[pe][T]:>8.2f} {predicted_last_k:>10.2f}   "
              f"{nonoverlap[pe][T]:>10.2f} {predicted_nonoverlap:>10.2f}")

# %% [markdown]
# The reconstructed numbers track the measured ones: the protocols do not measure different things, they
# *weight positions differently*. `last_k` asks "how good is the model at position $\approx T$?";
# `nonoverlap` asks "how good is it on average over positions $0..T$?". For length extrapolation the first
# question is the one we care about, which is why the rest of this series (and `make demo`) uses `last_k`.
#
# ## 5. Position-wise loss
#
# The curve itself is the most informative picture (Kerple's "position-wise perplexity"). Entry $t$ is the
# mean loss of predicting token $t+1$ from the $t+1$ tokens before it, averaged over `EVAL_WINDOWS`
# windows of `LONGEST` tokens. Per-position losses are noisy with few windows, so we smooth them with a
# running mean over 16 positions — careful at the start of the curve, which the logarithmic position axis
# stretches out: padding the curve by repeating position 0 (a common shortcut) would draw the first 15
# positions as averages of values that do not exist.
#
# ### Exercise 3.3 (implement) · A running mean without invented values
#
# Write `running_mean(curve, width)`: entry $t$ is the mean of `curve[max(0, t - width + 1) : t + 1]`, i.e. over
# the last `width` positions, or over all positions so far at the start. The plot below uses your function as
# soon as it passes its check (until then it draws the raw curves).

# %%
def running_mean(curve, width):
    """Mean over the last `width` positions (fewer at the start) of a 1-D tensor."""
    exercises.todo()                      # your code here


# %% tags=["solution"]
def running_mean(curve, width):
    """Mean over the last `width` positions (fewer at the start) of a 1-D tensor."""
    sums = torch.cat([curve.new_zeros(1), curve.cumsum(0)])      # sums[t] = curve[0] + ... + curve[t - 1]
    ends = torch.arange(1, len(curve) + 1)
    starts = (ends - width).clamp(min=0)
    return (sums[ends] - sums[starts]) / (ends - starts)


# %%
smoothed = exercises.check("running_mean", running_mean)
# Quick mode trains 8 steps, too few for any curve to turn up: the teacher's full-mode curves are drawn beside it.
reference_loss = notebook.reference("03/position_loss",
                                    {pe: [round(x, 4) for x in curve.tolist()] for pe, curve in position_loss.items()})


def smooth(curves):
    return {pe: running_mean(torch.as_tensor(curve), 16) if smoothed else torch.as_tensor(curve)
            for pe, curve in curves.items()}


notebook.beside_reference(md.plots.plot_loss_by_position, smooth(position_loss),
                          None if reference_loss is None else smooth(reference_loss), train_length=TRAIN_LENGTH,
                          title="Loss at each position of the longest windows"
                                + (" (running mean of 16)" if smoothed else " (raw: exercise 3.3 smooths it)"))
plt.show()

for pe, curve in position_loss.items():
    inside = curve[TRAIN_LENGTH // 2:TRAIN_LENGTH].mean()
    beyond = curve[-TRAIN_LENGTH:].mean()
    print(f"{pe:<11} mean loss at positions {TRAIN_LENGTH // 2}-{TRAIN_LENGTH - 1}: {inside:.3f}   "
          f"at the last {TRAIN_LENGTH} positions: {beyond:.3f} nats")

# %% [markdown]
# **Reading the plot.** Loss falls over the first few dozen positions as context accumulates: this is the
# part of the curve that `nonoverlap` over-weights. Past the training length (dashed line), an encoding that
# extrapolates keeps its curve flat (the model simply ignores what it cannot use), while one that does not
# turns upward somewhere past $L$ (compare the two printed means of each model; in quick mode, the teacher's
# full-mode curves on the right): the same model, the same text, only more positions than it has seen.
#
# ### What breaking looks like: text at 16× the training length
#
# Perplexities are averages; samples make the difference visible. Both models below continue the same
# validation text from position `LONGEST - 160`: every token they write sits at $15L$–$16L$, far beyond the
# 64 positions they were trained on. (Sampling with temperature 0.8 from the 10 most likely bytes, same seed.)

# %%
NEW_TOKENS = 160
prompt = val_tokens[5000:5000 + LONGEST - NEW_TOKENS].long()[None].to(DEVICE)
samples = {}
for pe in ("rope", "kerple_log"):
    torch.manual_seed(0)
    with torch.no_grad():
        written = models[pe].generate(prompt, NEW_TOKENS, temperature=0.8, top_k=10)[0, -NEW_TOKENS:]
    samples[pe] = bytes(written.tolist()).decode("utf-8", errors="replace").replace("\n", " ")
print("prompt ends with: ..." + bytes(prompt[0, -80:].tolist()).decode("utf-8", errors="replace").replace("\n", " "))
print()
columns = [textwrap.wrap(samples[pe], 48) for pe in samples]
print(f"{'RoPE at positions ' + str(LONGEST - NEW_TOKENS) + '+':<52}{'Kerple-log at the same positions'}")
for left, right in zip(*[column + [""] * (max(map(len, columns)) - len(column)) for column in columns]):
    print(f"{left:<52}{right}")

# %% [markdown]
# ## Summary
#
# - Inside the training length the encodings are nearly interchangeable; beyond it they separate.
# - Bias-based encodings (ALiBi, Kerple) extrapolate in perplexity by discounting far tokens; RoPE and NoPE
#   do not; a learned table cannot even run.
# - `last_k` and `nonoverlap` are two weightings of one position-wise loss curve; `last_k` isolates the
#   long-context positions and is the fairer measure of extrapolation (DAPE §5).
#
# Notebook 04 adds DAPE's refiner on top of Kerple: can a model keep the flat curve *and* use the far
# context?
#
# **Try it.** Train longer (`STEPS`), add `t5` or `yarn` to `PES`, or set `random_positions=4 * TRAIN_LENGTH`
# in `config("rope", ...)` (randomized positions, Ruoss et al. 2023) and see whether RoPE's curve flattens.

# %%
exercises.summary("03")
print(f"notebook run time: {RUN.seconds():.0f} s")
