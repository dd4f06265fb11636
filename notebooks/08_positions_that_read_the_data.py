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
# - **Per-layer encodings and a temperature that grows with the context**: RoPE layers interleaved with NoPE
#   layers (Llama 4's iRoPE; `pe="rope,none"`), and a softmax temperature $s_h \ln n$ (SSMax;
#   `temperature="learned"`).
#
# In minidape such a bias subclasses `md.DataDependentBias`: one module per layer, called with the layer's input
# and its queries and keys, returning `(batch, n_head, Tq, Tk)`. Every refiner reads it as $B$, so **DAPE-FoX**
# (`pe="fox", refiner="dape"`) comes for free.
#
# **Exercises:** 8.1 implement FoX's bias from its gates (2 points); 8.2 derive the temperature that keeps the
# attention on one key as the context grows (2); 8.3 experiment: predict, then measure, where FoX forgets (2: the
# measurement and the prediction).
#
# **Cost.** Trains seven models three times each (2 layers, 64 wide, 200 steps of 16 × 64 bytes: half the budget
# of notebooks 03–06) and evaluates them up to 16× their training length. Full mode takes 6–11 min (360, 546 and
# 654 s in three runs on a 2-core AMD EPYC CPU shared with other jobs, load average 10–28; the run time is printed
# at the end); a GPU runs the same budget much faster. Conclusions at this size are qualitative.

# %%
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import minidape as md
from minidape import exercises, notebook
from minidape.model import ALiBiBias, ContextualPositionBias, ForgetGateBias, LengthTemperature

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
# 04), FoX and DAPE-FoX, CoPE, and the RoPE/NoPE hybrid (layer 0 RoPE, layer 1 NoPE) with the learned temperature.
# Each trains with several seeds; the curves show the mean and the band of ± one standard deviation.

# %%
MODELS = {
    "ALiBi": dict(pe="alibi"),
    "Kerple-log": dict(pe="kerple_log"),
    "DAPE-Kerple": dict(pe="kerple_log", refiner="dape"),
    "FoX": dict(pe="fox"),
    "DAPE-FoX": dict(pe="fox", refiner="dape"),
    "CoPE": dict(pe="cope"),
    "RoPE/NoPE hybrid": dict(pe="rope,none", temperature="learned"),
}


def config(**overrides):
    return md.GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=TRAIN_LENGTH, **overrides)


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
# Read the table with its bands: at this budget (200 steps of a 2-layer model) differences smaller than the bands
# are noise. The growth column says how much each model degrades beyond its training length (printed above,
# smallest first). A bias that decays with distance (ALiBi, Kerple, FoX) keeps the far context from disturbing
# the prediction, which is what makes them extrapolate. CoPE's counts and the hybrid's NoPE layer have no such
# decay: in the committed full-mode run both degrade beyond the training length (CoPE's positions stop at its
# table's last entry, $P - 1$; the learned temperature had only 200 steps to learn how sharp to be). Whether DAPE
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
# after which the model most wants to start afresh (in the committed full-mode run spaces, about 0.5, against
# about 0.8 for punctuation, and heads differ: the heat map shows which). ALiBi cannot: its discount
# depends on $i - j$ only, the same whether the bytes in between close a sentence or sit inside a word — FoX's
# gate is exactly the missing input. For DAPE-FoX against FoX, quote the last printed line of section 4 and the
# bands: a difference inside the bands is not evidence either way at three seeds.

# %% [markdown]
# **Going further.** Register a bias of your own that reads the data (subclass `md.DataDependentBias`, see the
# README), e.g. FoX's gate computed from the key instead of every byte in between, and put it through
# `md.study.compare` against `FoX` and `DAPE-FoX`; or train `pe="rope,rope,rope,none"` with four layers.

# %%
exercises.summary("08")
print(f"notebook run time: {RUN.seconds():.0f} s")
