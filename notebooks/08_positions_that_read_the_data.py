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
# # 08 · Positions that read the data
#
# Every encoding of notebooks 01–07 decides how much a query attends to a key from their **positions** alone:
# ALiBi's $-m(i - j)$, Kerple's $-r_1 \ln(1 + r_2 (i - j))$, FIRE's MLP of the distance. DAPE (notebook 04) reads
# the content, but only to *refine* a bias that is still a function of $i - j$. Since 2024 the field has moved to
# position signals that depend on the content itself:
#
# - **FoX**, the Forgetting Transformer (Lin et al., ICLR 2025): each token writes a *forget gate*
#   $f_t = \sigma(w^\top x_t + b)$ per head, and query $i$ discounts key $j$ by every gate in between,
#   $D_{ij} = \sum_{l=j+1}^{i} \ln f_l$ — ALiBi whose slope each token sets (`pe="fox"`).
# - **CoPE**, contextual position encoding (Golovneva et al., 2024): a position counts the keys that *matter*
#   (gates $\sigma(q_i^\top k_j)$), so a model can count words or sentences instead of bytes (`pe="cope"`).
# - **Per-layer encodings and a temperature that grows with the context**: the published RoPE/NoPE hybrids put
#   a sliding or chunked window on their RoPE layers and leave one layer in four without positions (Cohere's
#   RNoPE-SWA, `pe="rope@sliding=16,rope@sliding=16,rope@sliding=16,none"`; Llama 4's iRoPE), and a softmax
#   temperature $s_h \ln n$ (SSMax; `temperature="learned"`).
# - **Stick-breaking attention** (Tan et al., ICLR 2025): no softmax; a query hands out its attention from the
#   nearest key backwards, so recency is built into the normaliser (`pe="stick_breaking"`).
# - **PaTH** (Yang et al., NeurIPS 2025): each token chooses a Householder-like transform that every key behind
#   it passes through, a rotation (or reflection) that reads the data where RoPE's is fixed (`pe="path"`).
#
# In minidape such a bias subclasses `md.DataDependentBias`: one module per layer, called with the layer's input
# and its queries and keys, returning `(batch, n_head, Tq, Tk)`. Every refiner reads it as $B$, so **DAPE-FoX**
# (`pe="fox", refiner="dape"`) comes for free.
#
# **Exercises:** 8.1 implement FoX's bias from its gates (2 points); 8.2 derive the temperature that keeps the
# attention on one key as the context grows (2); 8.3 experiment: predict, then measure, where FoX forgets (2: the
# measurement and the prediction); 8.4 implement stick-breaking's weights from the logits (2); 8.5 implement
# PaTH's scores from its transforms (2).
#
# **Cost.** Trains seven models three times each (4 layers, as the 3:1 hybrid needs, 64 wide, 200 steps of
# 16 × 64 bytes: half the steps of notebooks 03–06) and evaluates them up to 16× their training length. Full mode
# took 497 s in the committed run on a 2-core AMD EPYC CPU shared with other jobs (load average 3–6; 830 s in
# an earlier run at load 8–13; the run time is printed at the end); a GPU runs the same budget much faster.
# Conclusions at this size are qualitative.

# %%
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import minidape as md
from minidape import exercises, notebook
from minidape.model import (
    ALiBiBias,
    ContextualPositionBias,
    ForgetGateBias,
    LengthTemperature,
    PaTHAttention,
    StickBreakingAttention,
)

RUN = notebook.start()       # seeds torch, one CPU thread (tiny models), the clock of the run time printed at the end
QUICK = RUN.quick            # MINIDAPE_QUICK=1 (CI): fewer steps, lengths and seeds, the same code

BUDGET = notebook.books_budget(QUICK)   # the budget notebooks 03-06 share, at half the steps and evaluation
TRAIN_LENGTH, STEPS, BATCH, LR = BUDGET.train_length, BUDGET.steps // 2, BUDGET.batch, BUDGET.lr
LENGTHS, EVAL_WINDOWS, VAL_WINDOWS = BUDGET.lengths, BUDGET.eval_windows // 2, BUDGET.val_windows
SEEDS = 2 if QUICK else 3               # 21 models to train: each trains half as long as in notebooks 03-06

train_tokens = md.load_corpus("austen", "train")
val_tokens = md.load_corpus("austen", "val")
print(RUN, f"| steps {STEPS}, batch {BATCH}, training length {TRAIN_LENGTH} | seeds {SEEDS}")

# %%
# DEVICE: every model and tensor of this notebook lives here: CUDA if there is a GPU, then Apple's MPS, then the CPU.
DEVICE = notebook.device()
print("device:", DEVICE)

# %% [markdown]
# ## 1 · Why a fixed slope is not enough
#
# ALiBi gives head $h$ the bias $-m_h (i - j)$: a key 40 bytes back is discounted by $40 m_h$ whether those 40
# bytes are the rest of the current word or span two sentence boundaries. What a language model should forget
# depends on *what* lies in between. FoX makes the slope a function of the content: token $l$ says how much of
# the past to keep, $f_l \in (0, 1)$, and a key's discount is the sum of the log-gates it has to pass,
#
# $$D_{ij} = \sum_{l=j+1}^{i} \ln f_l = c_i - c_j, \qquad c_i = \sum_{l \le i} \ln f_l .$$
#
# With every gate equal, $f_l = e^{-m}$, this is exactly ALiBi: minidape's `fox` can start there
# (`fox_gate_init="alibi"`: $w = 0$ would give ALiBi's slopes; its default, the authors' init, starts every gate
# at $\tfrac12$ instead). Below: ALiBi's bias, and FoX's with gates that drop at the spaces of a real
# sentence (set by hand: $e^{-0.001}$ inside a word, $e^{-1}$ at a space), one head each.

# %%
text = b"It is a truth universally acknowledged, that a single man"
idx = torch.tensor(list(text))[None]                           # (1, T) bytes
T = idx.shape[1]
cfg = md.GPTConfig(n_layer=1, n_head=4, n_embd=32, block_size=64, pe="fox", fox_gate_init="alibi")
fox = ForgetGateBias(cfg)
alibi = ALiBiBias(cfg)(torch.arange(T), torch.arange(T))      # (h, T, T)

with torch.no_grad():
    torch.nn.init.zeros_(fox.gate.weight)                      # constant gates: FoX is ALiBi
    x = torch.randn(1, T, 32)
    q = k = torch.zeros(1, 4, T, 8)
    constant = fox(x, q, k)[0]
assert torch.allclose(constant.tril(), alibi.tril(), atol=1e-5)
print("FoX with constant gates sigma(b_h) = exp(-m_h) equals ALiBi:", torch.allclose(constant.tril(), alibi.tril(),
                                                                                     atol=1e-5))

is_space = (idx[0] == ord(" ")).float()
x_space = torch.zeros(1, T, 32)
x_space[0, :, 0] = is_space                                    # an input that says "space" on channel 0


def gate_logit(log_gate):
    """The logit a with ln sigmoid(a) = log_gate."""
    return -math.log(math.expm1(-log_gate))


with torch.no_grad():                                           # ln f = -0.001 inside a word, -1 at a space
    fox.gate.bias.fill_(gate_logit(-0.001))
    fox.gate.weight.zero_()
    fox.gate.weight[:, 0] = gate_logit(-1.0) - gate_logit(-0.001)
    hand_fox = fox(x_space, q, k)[0]                            # D (h, T, T)

fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
for ax, bias, title in ((axes[0], alibi[3], "ALiBi, head 3: -m (i - j)"),
                        (axes[1], hand_fox[0], "FoX, gates e^-1 at spaces")):
    shown = bias.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("nan"))
    image = ax.imshow(shown, cmap="viridis")
    ax.set_title(title)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    fig.colorbar(image, ax=ax, shrink=0.8)
plt.tight_layout()
plt.show()
words_back = hand_fox[0, -1].round().long()
print("FoX bias of the last query, keys 0..T-1, rounded (each step down is one space passed):",
      words_back.tolist())
assert torch.equal(-words_back, is_space.flip(0).cumsum(0).flip(0).roll(-1).masked_fill(torch.arange(T) == T - 1, 0)
                   .long())

# %% [markdown]
# The right picture is a staircase: within a word nothing is forgotten, and each space passed costs one unit.
# The model learns where the steps go.
#
# ### Exercise 8.1 (implement) · FoX's bias from the gates
#
# Write `fox_bias(log_forget)`: from the log forget gates `log_forget` (batch, n_head, T) return $D$
# (batch, n_head, T, T) with $D_{ij} = \sum_{l=j+1}^{i} \ln f_l$ for every key $j \le i$ (cells $j > i$ are
# masked: anything there is fine). The check draws fresh gates and names the usual mistakes (an index off by one,
# the sign, summing the gates instead of their logarithms).

# %%
def fox_bias(log_forget):
    exercises.todo("fox_bias")           # your code here: (batch, n_head, T) -> (batch, n_head, T, T)


# %% tags=["solution"]
def fox_bias(log_forget):
    """D_ij = sum_{l=j+1..i} log f_l = c_i - c_j with c the cumulative sum of the log-gates."""
    c = log_forget.cumsum(-1)                                   # c_i (batch, n_head, T)
    return c[..., :, None] - c[..., None, :]                   # (batch, n_head, T, T)


# %%
exercises.check("fox_bias", fox_bias)

# %% [markdown]
# Your function and minidape's `ForgetGateBias` compute the same bias from the same gates (here: a module with
# random gate weights):

# %%
torch.nn.init.normal_(fox.gate.weight)
with torch.no_grad():
    theirs = fox(x, q, k)
    if exercises.passed("fox_bias"):
        yours = fox_bias(fox.log_forget(x))
        same = torch.allclose(yours.tril(), theirs.tril(), atol=1e-5)
        print("your fox_bias equals md's ForgetGateBias:", same)
        assert same
    else:
        print("(exercise 8.1 not done yet)")

# %% [markdown]
# ## 2 · CoPE: counting words, not bytes
#
# CoPE asks every key whether it counts: $g_{ij} = \sigma(q_i^\top k_j / \sqrt{d})$. The position of key $j$ for
# query $i$ is the number of counted keys between them, $p_{ij} = \sum_{t=j}^{i} g_{it}$ (a real number), and
# the bias reads learned position vectors at $\lfloor p \rfloor$ and $\lceil p \rceil$, interpolated:
# $z_{ij} = (1 - w)\,q_i^\top e[\lfloor p_{ij} \rfloor] + w\,q_i^\top e[\lceil p_{ij} \rceil]$,
# $w = p_{ij} - \lfloor p_{ij} \rfloor$.
#
# If the keys at spaces say "count me" and the others do not, $p_{ij}$ is the number of **words** between $j$ and
# $i$: a head can then attend to "the previous word" at any length in bytes, which no function of $i - j$ can.
# Below, queries and keys set by hand so that the gates are 1 at spaces and 0 elsewhere:

# %%
cope = ContextualPositionBias(md.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=64, pe="cope"))
keys = torch.zeros(1, 1, T, 8)
keys[..., 0] = 2 * is_space - 1                                 # +1 at spaces, -1 elsewhere
queries = torch.zeros(1, 1, T, 8)
queries[..., 0] = 1000.0                                       # sigmoid(+-1000 / sqrt 8): exactly 1 or 0
positions = cope.positions(queries, keys)[0, 0]               # p_ij (T, T)
last = positions[-1]
spaces_from = is_space.flip(0).cumsum(0).flip(0)                # spaces in j..T-1, counted in Python
assert torch.equal(last, spaces_from)
print("CoPE position of each key for the last query (spaces from the key on):", last.long().tolist())
print("its distance i - j in bytes:                                     ", list(range(T - 1, -1, -1)))

# %% [markdown]
# Interpolation makes $z$ a smooth function of the gates, so the model can learn them by gradient descent: halfway
# between two counts, the bias is the average of the two position vectors' readings.

# %%
torch.nn.init.normal_(cope.embeddings)
read = (queries[0, 0, -1] / 1000) @ cope.embeddings             # q^T e[n], n = 0..P-1 for a unit query
half_gates = ContextualPositionBias(md.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=64, pe="cope"))
half_gates.embeddings.data.copy_(cope.embeddings.data)
unit = queries / 1000
z = half_gates(None, unit, torch.zeros_like(keys))[0, 0]        # every gate sigmoid(0) = 1/2: p = (i - j + 1) / 2
p = half_gates.positions(unit, torch.zeros_like(keys))[0, 0]
print(f"p at distance 2: {p[-1, -3].item():.2f}; z there: {z[-1, -3].item():.4f}; "
      f"mean of the readings at 1 and 2: {(read[1] + read[2]).item() / 2:.4f}")
assert torch.isclose(z[-1, -3], (read[1] + read[2]) / 2, atol=1e-5)

# %% [markdown]
# ## 3 · A temperature that grows with the context
#
# A softmax over $n$ keys flattens as $n$ grows: one key ahead of $n - 1$ others by a fixed logit gap $g$ gets
# $p = e^{g} / (e^{g} + n - 1)$, which falls towards 0. Multiplying the logits by a temperature $\tau$ that grows
# with $n$ keeps it where it was.
#
# ### Exercise 8.2 (derive) · The temperature that keeps the attention on one key
#
# One key's logit is ahead of the $n - 1$ others by `gap` (before the temperature). Derive the $\tau$ for which
# that key gets the share `p` of the attention, and write `focus_temperature(n, gap, p)`. The check draws new
# $n$, gap and $p$ each time it runs.

# %%
def focus_temperature(n, gap, p):
    exercises.todo("focus_temperature")   # your derivation here


# %% tags=["solution"]
def focus_temperature(n, gap, p):
    """p = e^(tau gap) / (e^(tau gap) + n - 1)  <=>  e^(tau gap) = (n - 1) p / (1 - p)."""
    return math.log((n - 1) * p / (1 - p)) / gap


# %%
exercises.check("focus_temperature", focus_temperature)

# %% [markdown] tags=["solution"]
# The answer grows like $\ln n$: $\tau(n) = (\ln(n - 1) + \ln\frac{p}{1-p}) / g$.

# %% [markdown]
# ### minidape's temperature option
#
# A temperature that grows with the number of keys is what minidape's `temperature` option gives the logits
# (`LengthTemperature`): `"log_length"` multiplies row $i$ by $\max(1, \ln n_i / \ln L)$ ($n_i$ keys seen, $L$
# the training length: nothing changes in training), and `"learned"` by $s_h \ln n_i$ with $s_h$ learned per head
# (SSMax). The curve below sets the temperature your answer needs beside it.

# %%
L = TRAIN_LENGTH
n = torch.arange(2, 16 * L + 1)
fixed = LengthTemperature(md.GPTConfig(block_size=L, temperature="log_length"))(0, 16 * L, 16 * L)[0, 1:, 0]
fig, ax = plt.subplots(figsize=(7, 3.8))
if exercises.passed("focus_temperature"):
    needed = torch.tensor([focus_temperature(int(count), 2.0, 0.5) for count in n])
    ax.plot(n, needed / needed[L - 2], label="tau that keeps p = 0.5 (gap 2), relative to n = L")
    slope = (needed[-1] - needed[L - 2]).item() / math.log((16 * L - 1) / (L - 1))
    print(f"beyond L the needed tau grows by {slope:.3f} per unit of ln(n - 1): 1 / gap = {1 / 2.0:.3f}")
    assert abs(slope - 0.5) < 1e-6
ax.plot(n, fixed, label="temperature='log_length': max(1, ln n / ln L)")
ax.axvline(L, color="gray", linestyle=":", label="training length L")
ax.set_xscale("log", base=2)
ax.set_xlabel("keys seen n")
ax.set_ylabel("temperature")
ax.legend(fontsize="small")
plt.show()

# %% [markdown]
# ## 4 · Training them: do biases that read the data extrapolate?
#
# Seven models, equal in everything but the encoding: ALiBi, Kerple-log and DAPE-Kerple (the best of notebook
# 04), FoX and DAPE-FoX, CoPE, and a hybrid as it is published: **RNoPE-SWA** (Cohere's recipe, the study's
# model of that name), three RoPE layers that each see only the last `WINDOW` keys (a sliding window, a quarter
# of the training length as in the study) and then one NoPE layer with full attention. Its pattern needs four
# layers, so every model here has four: same layers, width, steps, seeds and scored tokens, only the encoding
# differs. Each trains with several seeds; the curves show the mean and the band of ± one standard deviation.

# %%
WINDOW = TRAIN_LENGTH // 4               # the RoPE layers' sliding window: the study's ratio (32 of 128)
MODELS = {
    "ALiBi": dict(pe="alibi"),
    "Kerple-log": dict(pe="kerple_log"),
    "DAPE-Kerple": dict(pe="kerple_log", refiner="dape"),
    "FoX": dict(pe="fox"),
    "DAPE-FoX": dict(pe="fox", refiner="dape"),
    "CoPE": dict(pe="cope"),
    "RNoPE-SWA": dict(pe=",".join([f"rope@sliding={WINDOW}"] * 3 + ["none"])),   # 3 windowed RoPE : 1 NoPE
}


def config(**overrides):
    return md.GPTConfig(n_layer=4, n_head=4, n_embd=64, block_size=TRAIN_LENGTH, **overrides)


curves, trained = {}, {}          # trained: each model's seed-0 run, for the step times and FoX's gates below
for name, overrides in MODELS.items():
    curves[name] = []
    for seed in range(SEEDS):
        model, _ = md.train(config(**overrides), train_tokens, val_data=val_tokens, steps=STEPS,
                                  batch_size=BATCH, lr=LR, eval_every=STEPS, eval_windows=VAL_WINDOWS, seed=seed,
                                  progress=False, device=DEVICE)
        curves[name].append(md.evaluate.perplexity_by_length(model, val_tokens, LENGTHS, n_windows=EVAL_WINDOWS))
        if seed == 0:
            trained[name] = model
    at = {length: [curve[length] for curve in curves[name]] for length in LENGTHS}
    print(f"{name:<17} " + "  ".join(f"{length}: {sum(v) / len(v):6.2f}" for length, v in at.items()))

# %%
def plot_bands(bands, ax, title):
    """Mean perplexity against length with a band of ± one standard deviation over the seeds, per model."""
    for name, band in bands.items():
        lengths, mean, std = band["lengths"], torch.tensor(band["mean"]), torch.tensor(band["std"])
        style = md.plots.model_style(name)
        ax.plot(lengths, mean, marker="o", markersize=4, label=name, **style)
        ax.fill_between(lengths, mean - std, mean + std, color=style["color"], alpha=0.15)
    ax.axvline(TRAIN_LENGTH, color="#888888", linestyle="--", linewidth=1)
    ax.set(xscale="log", yscale="log", xlabel="evaluation length (tokens)", ylabel="perplexity per byte (last_k)",
           title=title)
    ax.set_xscale("log", base=2)
    ax.legend(fontsize="small")


summary, bands = {}, {}
for name, runs in curves.items():
    values = torch.tensor([[run[length] for length in LENGTHS] for run in runs])     # (seeds, lengths)
    summary[name] = values.mean(0)
    bands[name] = {"lengths": list(LENGTHS), "mean": values.mean(0).tolist(), "std": values.std(0).tolist()}
# Quick mode trains too little to separate the models: the teacher's full-mode run is drawn beside it.
reference_bands = notebook.reference("08/bands", bands)
notebook.beside_reference(plot_bands, bands, reference_bands, figsize=(8, 5),
                          title="Extrapolation, mean ± std over the seeds")
plt.show()

longest = LENGTHS[-1]
rows = ["| model | " + " | ".join(str(length) for length in LENGTHS) + " | growth to the longest |",
        "|---" * (len(LENGTHS) + 2) + "|"]
for name, mean in summary.items():
    rows.append(f"| {name} | " + " | ".join(f"{value:.2f}" for value in mean.tolist())
                + f" | {100 * (mean[-1] / mean[0] - 1).item():+.1f} % |")
display(Markdown("\n".join(rows)))
assert all(torch.isfinite(mean).all() for mean in summary.values())
growth = {name: (mean[-1] / mean[0]).item() for name, mean in summary.items()}
print(f"perplexity at {longest} over perplexity at {TRAIN_LENGTH}, smallest first:",
      ", ".join(f"{name} {value:.3f}" for name, value in sorted(growth.items(), key=lambda item: item[1])))
print(f"DAPE on FoX at {longest}: {summary['DAPE-FoX'][-1].item():.2f} vs {summary['FoX'][-1].item():.2f} without")

# %% [markdown]
# Read the table with its bands: at this budget (200 steps of a 4-layer model) differences smaller than the bands
# are noise. The growth column says how much each model degrades beyond its training length (printed above,
# smallest first). A bias that decays with distance (ALiBi, Kerple, FoX) keeps the far context from disturbing
# the prediction, which is what makes them extrapolate. In the committed full-mode run CoPE is the one model that
# degrades: +25 % from 64 to 1024 bytes, well outside its band (its positions stop at its table's last entry,
# $P - 1$). Every other model ends within 2 % of its perplexity at the training length, the published hybrid
# included: RNoPE-SWA ends 1.2 % below it, its band overlapping FoX's and below ALiBi's and Kerple-log's at every
# length. Its RoPE layers never meet a distance beyond their window, at any length, and its one NoPE layer
# has no position to misread: nothing in it sees a position it did not train on. Whether DAPE
# helps on top of FoX is the last line above. The study (REPRODUCTION.md and
# `python -m minidape compare --pe fox --against ALiBi DAPE-FoX CoPE ...`) asks the same with more seeds and
# confidence intervals.
#
# The cost of reading the data: the time of one training step (forward and backward on one batch) of each
# trained model, measured after a warm-up step each (a model's first step pays one-time costs), the models taking
# turns for 5 rounds so that a change of the machine's load hits them alike, the median round counted.
# `benchmarks/bench_new_encodings.py` measures the same with many more steps (its results are in
# `benchmarks/RESULTS.md`).

# %%
batch = val_tokens[: BATCH * TRAIN_LENGTH].long().view(BATCH, TRAIN_LENGTH).to(DEVICE)
step_ms = notebook.time_models(trained, batch, backward=True)
for name, ms in step_ms.items():
    print(f"{name:<17} {ms:6.1f} ms per step, {ms / step_ms['ALiBi']:5.2f}x ALiBi's")

# %% [markdown]
# ## 5 · Where does FoX forget?
#
# A trained FoX model writes a gate $f_t \in (0, 1]$ at every byte, one per head: the weight of everything
# before byte $t$ is multiplied by it, so a low gate is a place where the head forgets.
#
# ### Exercise 8.3 (experiment) · Predict, then measure, where FoX forgets
#
# Group the bytes of the validation text into four kinds: letters, spaces, punctuation and newlines. **Before**
# you run the measurement: on which kind will the trained FoX model forget most, i.e. have the lowest mean
# forget gate (over every layer and head)? Write your prediction, one of `"letter"`, `"space"`, `"punctuation"`,
# `"newline"`.

# %% tags=["prediction"]
fox_prediction = None                    # your prediction: "letter", "space", "punctuation" or "newline"


# %% tags=["solution", "prediction"]
fox_prediction = "space"                 # words are the unit of text: after a space a new word starts afresh

# %% [markdown]
# Now look: the trained model's gates on a stretch of validation text, one row per layer and head; dark
# cells are bytes where the head forgets (gate well below 1).

# %% tags=["reveals-prediction"]
model = trained["FoX"]
snippet = val_tokens[1000:1080]
idx = snippet[None].long().to(DEVICE)
with torch.no_grad():
    x, layer_inputs = model.hidden_states(idx, upto_layer=0)
    gates = []
    for layer, block in enumerate(model.blocks):              # the gates of each layer, from its own input
        gates.append(block.attn.data_bias.log_forget(block.ln_1(x)).exp()[0].cpu())   # (n_head, T)
        x = block(x, layer_inputs[layer])
gates = torch.cat(gates)                                        # (n_layer * n_head, T)
characters = [chr(byte) if 32 <= byte < 127 else "⏎" if byte == 10 else "·" for byte in snippet.tolist()]
fig, ax = plt.subplots(figsize=(14, 3))
image = ax.imshow(gates, aspect="auto", cmap="magma", vmin=float(gates.min()), vmax=1.0)
ax.set_xticks(range(len(characters)), characters, fontsize=7, fontfamily="monospace")
ax.set_yticks(range(len(gates)), [f"L{i // model.cfg.n_head} h{i % model.cfg.n_head}" for i in range(len(gates))])
ax.set_title("FoX's forget gates f_t on validation text (low = forget)")
fig.colorbar(image, ax=ax)
plt.show()

# %% [markdown]
# The measurement: the mean gate of each kind over 4,096 bytes of validation text (computed below). Then write
# `forgets_most`, the kind that forgets most, from `mean_gate`.

# %% tags=["reveals-prediction"]
text = val_tokens[:4096]
with torch.no_grad():
    x, layer_inputs = model.hidden_states(text[None].long().to(DEVICE), upto_layer=0)
    per_byte = []
    for layer, block in enumerate(model.blocks):
        per_byte.append(block.attn.data_bias.log_forget(block.ln_1(x)).exp()[0].cpu())   # (n_head, T)
        x = block(x, layer_inputs[layer])
    per_byte = torch.cat(per_byte).mean(0)                     # mean over layers and heads (T,)
letters = torch.tensor([chr(b).isalpha() for b in text.tolist()])
kinds = {"letter": letters, "space": text == ord(" "), "newline": text == ord("\n"),
         "punctuation": torch.tensor([chr(b) in ".,;:!?\"'-" for b in text.tolist()])}
mean_gate = {kind: per_byte[where].mean().item() for kind, where in kinds.items() if where.any()}
print({kind: round(value, 4) for kind, value in mean_gate.items()})

forgets_most = None                      # your measurement: the kind with the lowest mean gate


# %% tags=["solution"]
forgets_most = min(mean_gate, key=mean_gate.get)

# %%
exercises.check("where_fox_forgets", fox_prediction, forgets_most, mean_gate)

# %% [markdown] tags=["written", "rubric:where_fox_forgets"]
# **Your answer.** Look at the heat map and the mean gates above: is the kind that forgets most the one you
# expected, and by how much does it differ from the others? Would ALiBi, with one fixed slope per head, have any
# way to do the same? And in the table of section 4: does DAPE still help on top of FoX?

# %% [markdown] tags=["solution"]
# **Worked answer.** Quote the four mean gates printed above and the heat map: the lowest mean marks the bytes
# after which the model most wants to start afresh. In the committed full-mode run letters (0.29) and spaces
# (0.30) lie close, below newlines (0.35) and punctuation (0.43), and heads differ (the heat map shows which):
# the worked prediction, spaces, missed by 0.01, a gap that another seed could reverse. ALiBi cannot: its discount
# depends on $i - j$ only, the same whether the bytes in between close a sentence or sit inside a word — FoX's
# gate is exactly the missing input. For DAPE-FoX against FoX, quote the last printed line of section 4 and the
# bands: a difference inside the bands is not evidence either way at three seeds.

# %% [markdown]
# ## 6 · Stick-breaking: recency built into the normaliser
#
# Every model so far turns its scores into weights with a softmax, which splits a query's attention by the scores
# alone: two keys with the same score get the same weight however far back they are, and any recency has to come
# from a bias added to the scores. Stick-breaking attention (Tan et al., ICLR 2025) has no softmax. Below,
# minidape's `StickBreakingAttention` on two inputs set by hand: on the left every score is 0; on the right the
# sentence of section 1, with keys that match the query at the spaces (a large score) and nowhere else, beside a
# softmax over the same scores and the same keys (those before the query).

# %%
sentence = torch.tensor(list(b"It is a truth universally acknowledged, that a single man"))
length = len(sentence)
at_space = (sentence == ord(" ")).float()
sticks = StickBreakingAttention(md.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=64, pe="stick_breaking"))
no_values = torch.zeros(1, 1, length, 8)
with torch.no_grad():
    _, equal_scores = sticks(None, no_values, no_values, no_values)            # q = k = 0: every score 0
    matching_keys = torch.zeros(1, 1, length, 8)
    matching_keys[..., 0] = 2 * at_space - 1                                     # +1 at spaces, -1 elsewhere
    matching_queries = torch.zeros(1, 1, length, 8)
    matching_queries[..., 0] = 20.0                                              # scores +-20 / sqrt 8
    _, matching = sticks(None, matching_queries, matching_keys, no_values)
flat = equal_scores["probs"][0, 0, -1].flip(0)[1:]                             # last query, keys i-1, i-2, ...
sticks_last = matching["probs"][0, 0, -1]
scores_last = matching["scores"][0, 0, -1]
softmax_last = torch.softmax(scores_last[:-1], -1)                               # softmax over the keys j < i
fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4))
left.plot(range(1, length), flat, marker="o", markersize=3)
left.set(yscale="log", xlabel="distance i - j", ylabel="weight", title="stick-breaking, every score 0 (last query)")
positions_back = range(length - 1)
right.plot(positions_back, sticks_last[:-1], marker="o", markersize=3, label="stick-breaking")
right.plot(positions_back, softmax_last, marker="s", markersize=3, label="softmax, same scores")
right.set_xticks(positions_back, [chr(byte) for byte in sentence[:-1].tolist()], fontsize=7, fontfamily="monospace")
right.set(xlabel="key j", ylabel="weight", title="keys that match at the spaces (last query)")
right.legend(fontsize="small")
plt.tight_layout()
plt.show()
nearest_space = int(at_space[:-1].nonzero().max())
print("every score 0, weights of the keys 1, 2, 3, 4 back:", [round(value, 4) for value in flat[:4].tolist()],
      f"| their sum over all {length - 1} keys: {flat.sum().item():.6f}")
print(f"matching spaces: stick-breaking gives the nearest space {sticks_last[nearest_space].item():.3f} and all "
      f"{int(at_space[:-1].sum())} spaces {sticks_last[at_space.bool()].sum().item():.3f}; softmax gives each "
      f"space {softmax_last[nearest_space].item():.3f}")
assert torch.allclose(flat, 0.5 ** torch.arange(1, length).float(), rtol=1e-5)
assert sticks_last[nearest_space] > 0.99 and torch.allclose(softmax_last[at_space[:-1].bool()],
                                                                softmax_last[nearest_space])

# %% [markdown]
# With every score equal, each step back halves the weight: an exponential decay, ALiBi's shape, that nobody
# added to the scores. And where several keys match, the nearest one takes almost everything, while the softmax
# shares its attention equally among all the matching spaces. The rule behind both pictures: query $i$ breaks a
# stick of length 1, starting from its nearest earlier key. Key $j$ takes the share $\beta_{ij} = \sigma(z_{ij})$
# (its score $z_{ij} = q_i^\top k_j / \sqrt{d}$ through a sigmoid, not a softmax) of what the keys between it and
# the query left over:
#
# $$A_{ij} = \beta_{ij} \prod_{j < k < i} (1 - \beta_{ik}), \qquad j < i .$$
#
# With every score 0, $\beta = \tfrac12$ and $A_{ij} = \tfrac12 \cdot (\tfrac12)^{i-j-1}$: the halving on the
# left. The weights sum to at most 1 (here $1 - 2^{-i}$); what is left attends to nothing. Recency is built into
# the normaliser, and the scores, which read the data, decide where the stick runs out.
#
# ### Exercise 8.4 (implement) · Stick-breaking's weights from the scores
#
# Write `stick_breaking_weights(z)`: from the scores `z` (batch, n_head, T, T) return the weights $A$
# (batch, n_head, T, T) of the equation above for every key $j < i$, and 0 for $j \ge i$ (a query attends to
# earlier keys only). A long product of numbers below 1 is safer as a sum of their logarithms. The check draws
# fresh scores, computes the weights from the paper's equation one cell at a time, and names the usual mistakes
# (the key's own share in the product, the stick broken from the oldest key, a softmax, weights on later keys).

# %%
def stick_breaking_weights(z):
    exercises.todo("stick_breaking_weights")   # your code here: (batch, n_head, T, T) -> (batch, n_head, T, T)


# %% tags=["solution"]
def stick_breaking_weights(z):
    """ln A_ij = ln sigma(z_ij) + sum_{j<k<i} ln sigma(-z_ik) (as 1 - sigma(z) = sigma(-z)) for j < i; 0 elsewhere."""
    earlier = torch.ones(z.shape[-1], z.shape[-1], dtype=torch.bool, device=z.device).tril(-1)
    log_left = torch.nn.functional.logsigmoid(-z).masked_fill(~earlier, 0.0)    # ln(1 - beta_ik) of the keys k < i
    between = log_left.flip(-1).cumsum(-1).flip(-1) - log_left                   # sum over k = j+1 .. i-1
    return (torch.nn.functional.logsigmoid(z) + between).exp().masked_fill(~earlier, 0.0)


# %%
exercises.check("stick_breaking_weights", stick_breaking_weights)

# %% [markdown]
# Your function and minidape's `StickBreakingAttention` give the same weights for the same random queries and keys:

# %%
q_random, k_random = torch.randn(2, 1, 4, 12, 8).unbind(0)                     # (batch, n_head, T, head size)
with torch.no_grad():
    _, theirs = sticks(None, q_random, k_random, torch.zeros_like(q_random))
    if exercises.passed("stick_breaking_weights"):
        yours = stick_breaking_weights(q_random @ k_random.transpose(-2, -1) / math.sqrt(8))
        same = torch.allclose(yours, theirs["probs"], atol=1e-6)
        print("your stick_breaking_weights equals md's StickBreakingAttention:", same)
        assert same
    else:
        print("(exercise 8.4 not done yet)")

# %% [markdown]
# ## 7 · PaTH: a transform that reads the data
#
# RoPE rotates a key by an angle set by its distance to the query: the same rotation per step, whatever the
# tokens in between. PaTH (Yang et al., NeurIPS 2025) lets every token choose how it transforms the keys that pass
# it on their way to a later query. Below, minidape's `PaTHAttention` with that choice set by hand on the
# sentence above: every query and key is the same unit vector $e_1$, each space reflects the keys behind it along
# $e_1$, and every other byte leaves them as they are. The picture shows the scores $S_{ij}$ (before the
# $1/\sqrt{d}$), one row per query.

# %%
path = PaTHAttention(md.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=64, pe="path"))
unit_vector = torch.zeros(1, 1, length, 8)
unit_vector[..., 0] = 1.0                                                      # q = k = w = e_1 at every byte
space_reflects = 2 * at_space[None, None]                                      # beta: 2 at a space, 0 elsewhere
path.directions = lambda x: (unit_vector, space_reflects)                      # the tokens' choice, set by hand
with torch.no_grad():
    _, flip_flop = path(None, unit_vector, unit_vector, torch.zeros_like(unit_vector))
flips = flip_flop["scores"][0, 0] * math.sqrt(8)                                # S_ij (T, T)
fig, ax = plt.subplots(figsize=(6, 5))
image = ax.imshow(flips.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("nan")),
                  cmap="coolwarm", vmin=-1, vmax=1)
ax.set(title="PaTH's scores, a reflection at every space", xlabel="key j", ylabel="query i")
fig.colorbar(image, ax=ax, shrink=0.8)
plt.show()
print("score of the last query with each key (the sign flips at every space passed):",
      flips[-1].round().long().tolist())
spaces_after = at_space.flip(0).cumsum(0).flip(0) - at_space                   # spaces after key j, up to the query
assert torch.allclose(flips[-1], (-1.0) ** spaces_after, atol=1e-5)

# %% [markdown]
# The score of key $j$ is $+1$ or $-1$ by whether an even or odd number of spaces lie between it and the query:
# the parity of the words in between, a state that flips with the data. No function of $i - j$ can do that, and
# neither can RoPE, whose transform between two positions is fixed by their distance. In the paper's terms each
# token $t$ writes a direction $w_t$ (unit length) and a strength $\beta_t \in (0, 2)$, and a key reaches query
# $i$ through the Householder-like transforms of every token after it:
#
# $$S_{ij} = q_i^\top H_i H_{i-1} \cdots H_{j+1}\, k_j, \qquad H_t = I - \beta_t w_t w_t^\top,$$
#
# then a softmax over $S / \sqrt{d}$ as usual. $\beta_t = 2$ is a reflection (above: orthogonal, it keeps the
# key's length), $\beta_t = 0$ leaves the key alone, and in between it shrinks the key along $w_t$. minidape's
# layer computes $w_t$ and $\beta_t$ from the tokens (a projection and a short causal convolution), so the model
# learns where to transform.
#
# ### Exercise 8.5 (implement) · PaTH's scores from the transforms
#
# Write `path_scores(q, k, w, beta)` for one head: from the queries and keys `q`, `k` (T, d), the unit directions
# `w` (T, d) and the strengths `beta` (T,), return $S$ (T, T) with $S_{ij}$ as above for every key $j \le i$
# ($S_{ii} = q_i^\top k_i$: no token lies between; cells $j > i$ are masked: anything there is fine; no
# $1/\sqrt{d}$). The transforms do not commute: their order matters. The check draws fresh inputs, multiplies the
# transforms out as $d \times d$ matrices, and names the usual mistakes (the key's own transform, the query's left
# out, the order reversed, the sign, no transform at all).

# %%
def path_scores(q, k, w, beta):
    exercises.todo("path_scores")             # your code here: (T, d), (T, d), (T, d), (T,) -> (T, T)


# %% tags=["solution"]
def path_scores(q, k, w, beta):
    """Carry every earlier key forward: at position i, H_i acts on the keys carried so far, then k_i joins."""
    T = q.shape[0]
    scores = torch.zeros(T, T, dtype=q.dtype)
    carried = k[:0]                                                     # the keys j < i carried to position i
    for i in range(T):
        carried = carried - beta[i] * (carried @ w[i])[:, None] * w[i]  # H_i k = k - beta_i (w_i . k) w_i
        carried = torch.cat([carried, k[i : i + 1]])                    # k_i joins as it is (empty product)
        scores[i, : i + 1] = carried @ q[i]
    return scores


# %%
exercises.check("path_scores", path_scores)

# %% [markdown]
# Your function and minidape's `PaTHAttention` give the same scores, with directions and strengths that the layer
# computes from random tokens (head 1 of 2):

# %%
learned_path = PaTHAttention(md.GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64, pe="path"))
x_random = torch.randn(1, 12, 16)
q_random, k_random = torch.randn(2, 1, 2, 12, 8).unbind(0)
with torch.no_grad():
    w_random, beta_random = learned_path.directions(x_random)
    _, theirs = learned_path(x_random, q_random, k_random, torch.zeros_like(q_random))
    if exercises.passed("path_scores"):
        yours = path_scores(q_random[0, 1], k_random[0, 1], w_random[0, 1], beta_random[0, 1]) / math.sqrt(8)
        same = torch.allclose(yours.tril(), theirs["scores"][0, 1].tril(), atol=1e-5)
        print("your path_scores equals md's PaTHAttention:", same)
        assert same
    else:
        print("(exercise 8.5 not done yet)")

# %% [markdown]
# Both train by name like every encoding here (`md.GPTConfig(pe="stick_breaking")`, `pe="path"`, and the
# labels `Stick-breaking` and `PaTH` of `python -m minidape compare`), in their papers' $O(T^2)$ forms; this
# notebook does not train them.

# %% [markdown]
# **Going further.** Register a bias of your own that reads the data (subclass `md.DataDependentBias`, see the
# README), e.g. FoX's gate computed from the key instead of every byte in between, and put it through
# `md.study.compare` against `FoX` and `DAPE-FoX`; or put the study's other hybrids (`iRoPE`, `SWAN`) beside
# RNoPE-SWA in section 4.

# %%
exercises.summary("08")
print(f"notebook run time: {RUN.seconds():.0f} s")
