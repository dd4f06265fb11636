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
# # 01 · Positional encodings: what each one adds, and where
#
# Self-attention on its own is blind to order: section 0 shuffles the keys and values of one query and gets
# the same answer to the last digit. A *positional encoding* (PE) puts order back in. minidape has one of each
# family the DAPE, CAPE, DAPE-V2 and Kerple papers compare against, and they act in three different places of
# a layer:
#
# | where | formula | encodings |
# |---|---|---|
# | token embeddings | $x_i = e_{t_i} + P_i$ | `learned` (GPT-2), `sinusoidal` (Vaswani et al.) |
# | queries and keys | $q_m \mapsto R_m q_m,\ k_n \mapsto R_n k_n$ | `rope` (Su et al.), `yarn` (Peng et al.) |
# | attention scores | $A = \mathrm{softmax}\big(q_m^\top k_n/\sqrt{d} + b_h(m, n)\big)$ | `t5`, `alibi`, `kerple_log`, `kerple_power`, `fire` |
# | nowhere | the causal mask alone | `none` (NoPE, Kazemnejad et al.) |
#
# This notebook opens each one up on untrained models (no training here; notebook 03 trains them), and asks
# the question of the whole series: **what happens beyond the training length** `block_size`?
#
# **Cost.** Nothing is trained; full mode runs in about under a minute
# (26 s measured on a 2-core AMD EPYC CPU shared with other jobs), and the same on a GPU. `MINIDAPE_QUICK=1` shortens the longest length.
#
# **Exercises** (each has a check cell that says *passed* with its points, which mistake it sees with a hint
# for it, or *not done yet*): 1.1 implement the sinusoidal table (2 points); 1.2 derive RoPE's score
# $\langle R_t q, R_0 k\rangle$ in closed form (2); 1.3 implement ALiBi's bias (2); 1.4 experiment: predict, then
# measure, how spread out ALiBi's attention is 16× beyond the training length (2: the measurement and a
# prediction within ±0.5 nats), with a written answer.

# %%
import math

import matplotlib.pyplot as plt
import torch

import minidape as md
from minidape import exercises, notebook
from minidape.model import AbsolutePositions, AdditiveBias, RotaryEmbedding, apply_rotary

QUICK = notebook.start(one_thread=False).quick   # seeds torch; MINIDAPE_QUICK=1 (CI) shortens LONG
TRAIN_LENGTH = 64                               # block_size: the training length of every model below
LONG = 4 * TRAIN_LENGTH if QUICK else 16 * TRAIN_LENGTH   # a length far beyond training


def tiny_config(pe, **overrides):
    """A small model: 2 layers, 4 heads of size 32. Positional encodings do not care about depth."""
    settings = dict(n_layer=2, n_head=4, n_embd=128, block_size=TRAIN_LENGTH, pe=pe)
    return md.GPTConfig(**{**settings, **overrides})


print("registered positional encodings:", list(md.PE_NAMES))

# %%
# DEVICE: every model and tensor of this notebook lives here: CUDA if there is a GPU, then Apple's MPS, then the CPU.
DEVICE = notebook.device()
print("device:", DEVICE)

# %% [markdown]
# ## 0. Attention cannot see order
#
# One query attends to six tokens. Its weights are the softmax of the scores $q^\top k_j/\sqrt{d}$, its output
# the weighted sum of the values $v_j$. Below, the same six tokens twice: in their order, and shuffled (keys and
# values moved together, as they are when the words of a sentence are reordered).

# %%
words = ["the", "cat", "sat", "on", "a", "mat"]
width = 8
generator = torch.Generator().manual_seed(0)
query = torch.randn(width, generator=generator)
keys = torch.randn(len(words), width, generator=generator)
values = torch.randn(len(words), width, generator=generator)
shuffle = torch.tensor([3, 5, 0, 4, 1, 2])                 # "on mat the a cat sat"


def attend(query, keys, values):
    """One query's attention without positions: softmax(q k_j / sqrt(d)) and the weighted sum of the values."""
    weights = torch.softmax(keys @ query / width**0.5, dim=0)
    return weights, weights @ values


weights, output = attend(query, keys, values)
shuffled_weights, shuffled_output = attend(query, keys[shuffle], values[shuffle])
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3), sharey=True)
left.bar(words, weights, color="#0072B2")
left.set(title="in order: " + " ".join(words), ylabel="attention weight")
right.bar([words[i] for i in shuffle], shuffled_weights, color="#0072B2")
right.set(title="shuffled: " + " ".join(words[i] for i in shuffle))
fig.suptitle("Each word keeps its weight wherever it stands")
plt.tight_layout()
plt.show()
print("output in order :", [round(x, 4) for x in output.tolist()])
print("output shuffled :", [round(x, 4) for x in shuffled_output.tolist()])
assert torch.allclose(output, shuffled_output, atol=1e-6)                      # the same answer
assert torch.allclose(shuffled_weights, weights[shuffle])                      # each word kept its weight

# %% [markdown]
# Each word's weight depends on its key alone, so the weights move with the words and the weighted sum does not
# change: the two outputs agree to the last printed digit. Attention is **permutation-invariant** over its keys;
# "the cat sat on a mat" and "on mat the a cat sat" look the same to it. Everything in this series is about
# what to add so that they do not — and about what that addition does at lengths never seen in training.

# %% [markdown]
# ## 1. The map: kind, module, parameters
#
# Every name in `md.PE_NAMES` is a class in `minidape/model.py`. The model builds **one** instance,
# `model.pe`, shared by all layers; its base class says where it acts. The table counts the encoding's own
# parameters (a learned table has `block_size × n_embd` of them; ALiBi, RoPE and sinusoidal have none).

# %%
# NBVAL_CHECK_OUTPUT
def kind_of(pe_module):
    if isinstance(pe_module, AbsolutePositions):
        return "absolute: added to token embeddings"
    if isinstance(pe_module, RotaryEmbedding):
        return "rotary: rotates q and k"
    if isinstance(pe_module, AdditiveBias):
        return "bias: added to the scores"
    return "none"


# The encodings of positions alone, which this notebook is about; md.PE_NAMES (printed above) lists every registered
# one and grows as encodings are added (those that read the data are notebook 08's), so the table takes this list.
FROM_POSITIONS = ["none", "learned", "sinusoidal", "rope", "yarn", "rope_pi", "rope_ntk", "xpos", "hope",
                  "alibi", "t5", "kerple_log", "kerple_power", "fire"]
print(f"{'pe':<13} {'class':<22} {'parameters':>10}  kind")
for name in FROM_POSITIONS:
    pe_module = md.GPT(tiny_config(name)).to(DEVICE).pe
    n_params = sum(p.numel() for p in pe_module.parameters())
    print(f"{name:<13} {type(pe_module).__name__:<22} {n_params:>10}  {kind_of(pe_module)}")

# %% [markdown]
# ## 2. Absolute encodings: a vector per position, added to the token embedding
#
# `sinusoidal` (Vaswani et al., 2017, §3.5) writes position $p$ as $P_{p,2i} = \sin(p\,\omega_i)$,
# $P_{p,2i+1} = \cos(p\,\omega_i)$ with $\omega_i = 10000^{-2i/d}$: a clock with hands of many speeds. It is
# defined at every position, and its dot products depend only on the offset,
# $P_m^\top P_n = \sum_i \cos\big((m-n)\,\omega_i\big)$, but the model sees $e_{t} + P$ and the attention
# logits mix tokens and positions: nothing forces it to use the relative part.
#
# The left panel shows $P$; the right panel $P_m^\top P_n$, constant along every diagonal.

# %%
sinusoidal = md.GPT(tiny_config("sinusoidal")).to(DEVICE).pe
P = sinusoidal(torch.arange(2 * TRAIN_LENGTH, device=DEVICE)).cpu()
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
image = left.imshow(P.T, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1)   # diverging colours centred on 0
left.set(title="sinusoidal $P$: one column per position", xlabel="position p", ylabel="channel")
fig.colorbar(image, ax=left)
image = right.imshow(P @ P.T, cmap="viridis")
right.set(title=r"$P_m^\top P_n$ depends on $m - n$ only", xlabel="position n", ylabel="position m")
fig.colorbar(image, ax=right)
plt.tight_layout()
plt.show()

# %% [markdown]
# `learned` is GPT-2's table $P \in \mathbb{R}^{\text{block\_size} \times d}$. Row $p$ is trained only if some
# training sequence reaches position $p$, and there is no row at all past the table: a learned table **cannot
# extrapolate**. minidape refuses rather than silently clamping or wrapping positions:

# %%
# NBVAL_CHECK_OUTPUT
learned_model = md.GPT(tiny_config("learned")).to(DEVICE).eval()
tokens = torch.randint(0, 256, (1, 2 * TRAIN_LENGTH)).to(DEVICE)
print("at the training length:", tuple(learned_model(tokens[:, :TRAIN_LENGTH])[0].shape))
try:
    learned_model(tokens)
except ValueError as error:
    print("at twice the training length: ValueError:", error)

# %% [markdown]
# ### Exercise 1.1 (implement) · The sinusoidal table
#
# Write `sinusoidal_table(positions, d)`: a `(T,)` tensor of positions and a width $d$ (even) in, the `(T, d)`
# table $P$ out, with $P_{p,2i} = \sin(p\,\omega_i)$, $P_{p,2i+1} = \cos(p\,\omega_i)$,
# $\omega_i = 10000^{-2i/d}$. The check compares it with minidape's `sinusoidal` encoding at several widths.

# %%
def sinusoidal_table(positions, d):
    """(T,) positions -> (T, d) sinusoidal table, sines and cosines interleaved."""
    exercises.todo()                      # your code here


# %% tags=["solution"]
def sinusoidal_table(positions, d):
    """(T,) positions -> (T, d) sinusoidal table, sines and cosines interleaved."""
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)     # (d/2,)
    angle = positions.float()[:, None] * omega                                # (T, d/2)
    table = torch.empty(len(positions), d)
    table[:, 0::2], table[:, 1::2] = angle.sin(), angle.cos()
    return table


# %%
exercises.check("sinusoidal_table", sinusoidal_table)

# %% [markdown]
# ## 3. Rotary encodings: rotate queries and keys
#
# RoPE (Su et al., 2021, §3.4) adds nothing to a vector: it **turns** it. Take one pair of channels of a query
# and one of a key: each is an arrow in the plane. At position $m$ the query's arrow is turned by the angle
# $m\theta$, at position $n$ the key's by $n\theta$. Below: a query at $m = 5$ and a key at $n = 2$, then the
# same two tokens moved 4 and 10 positions further along the text ($\theta = 0.3$ rad per position).

# %%
PAIR_THETA = 0.3                                    # radians per position of the pair drawn here
PAIR_QUERY, PAIR_KEY = (1.0, 0.25), (0.8, -0.45)    # one channel pair of a query and of a key


def turned(vector, angle):
    """A 2-D vector turned counter-clockwise by `angle` radians: what RoPE does to one channel pair."""
    x, y = vector
    return (x * math.cos(angle) - y * math.sin(angle), x * math.sin(angle) + y * math.cos(angle))


def draw_pair(ax, m, n):
    """The query's pair at position m and the key's at position n as arrows; returns the angle between them."""
    q, k = turned(PAIR_QUERY, m * PAIR_THETA), turned(PAIR_KEY, n * PAIR_THETA)
    circle = torch.linspace(0, 2 * math.pi, 100)
    ax.plot(circle.cos(), circle.sin(), color="#888888", linewidth=0.5)
    for vector, color, text in ((q, "#D55E00", f"q at m = {m}"), (k, "#0072B2", f"k at n = {n}")):
        ax.annotate("", xy=vector, xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color=color, linewidth=2))
        ax.text(1.1 * vector[0], 1.1 * vector[1], text, color=color, ha="center", va="center")
    between = math.degrees(math.atan2(q[1], q[0]) - math.atan2(k[1], k[0])) % 360
    ax.set(xlim=(-1.5, 1.5), ylim=(-1.5, 1.5), aspect="equal", xticks=[], yticks=[],
           title=f"m - n = {m - n}: angle between {between:.1f}°")
    return between


fig, axes = plt.subplots(1, 3, figsize=(12, 4))
angles = [draw_pair(ax, 5 + shift, 2 + shift) for ax, shift in zip(axes, (0, 4, 10))]
fig.suptitle(r"RoPE turns the query by $m\theta$ and the key by $n\theta$: shifting both keeps the angle between")
plt.tight_layout()
plt.show()
scores = [sum(a * b for a, b in zip(turned(PAIR_QUERY, (5 + s) * PAIR_THETA), turned(PAIR_KEY, (2 + s) * PAIR_THETA)))
          for s in (0, 4, 10)]
print("angle between q and k at shifts 0, 4, 10:", [f"{angle:.1f}°" for angle in angles])
print("their dot product (the score)          :", [f"{score:.4f}" for score in scores])
assert max(angles) - min(angles) < 1e-9 and max(scores) - min(scores) < 1e-12

# %% [markdown]
# Both arrows turned, each by a different amount, yet the angle between them and so their dot product, the
# attention score, did not move: it depends on how far apart the two tokens are, $m - n$, not on where they
# stand. Drag the slider to move both tokens along the text yourself (it needs `ipywidgets`; the figure above
# shows three of its positions, for a printed page).

# %%
try:
    import ipywidgets
except ImportError:   # the static figure above shows the same
    ipywidgets = None
    print("no ipywidgets here (pip install ipywidgets): the figure above shows shifts 0, 4 and 10")

if ipywidgets is not None:
    @ipywidgets.interact(shift=ipywidgets.IntSlider(value=0, min=0, max=40, description="shift s"))
    def move_both(shift):
        fig, ax = plt.subplots(figsize=(4.5, 4.5))
        draw_pair(ax, 5 + shift, 2 + shift)
        plt.show()

# %% [markdown]
# In a real head every pair turns, at its own speed: the $d$ channels split into $d/2$ pairs, and pair $i$ of a
# query or key at position $m$ turns by the angle $m\theta_i$, $\theta_i = 10000^{-2i/d}$. Turning by $m\theta$
# and then back by $n\theta$ is turning by $(m - n)\theta$, so what the picture showed holds for the whole head:
#
# $$\langle R_m q, R_n k\rangle = \langle q, R_{n-m} k\rangle :$$
#
# the score depends on the positions **only through $m - n$**. Nothing is added to the embeddings and there is
# no bias matrix ($B = 0$ for the refiners of notebooks 04–05). Check it with minidape's own rotation: shift
# both positions by the same amount and the score does not move (up to float32 rounding).

# %%
# NBVAL_CHECK_OUTPUT
rope = md.GPT(tiny_config("rope")).to(DEVICE).pe
head_size = 128 // 4
generator = torch.Generator().manual_seed(1)
q, k = torch.randn(2, head_size, generator=generator).to(DEVICE)


def rotary_score(q, k, m, n):
    """<R_m q, R_n k> with minidape's own rotation."""
    cos, sin = rope(torch.tensor([m, n], device=DEVICE), T=max(m, n) + 1)
    rotated_q = apply_rotary(q[None, None, None], cos[:1], sin[:1])
    rotated_k = apply_rotary(k[None, None, None], cos[1:], sin[1:])
    return (rotated_q * rotated_k).sum().item()


for m, n in [(5, 2), (40, 10)]:
    shifted = [rotary_score(q, k, m + s, n + s) for s in (0, 10, 100, 1000)]
    spread = max(shifted) - min(shifted)
    # the score itself is a float sum whose last digits depend on the CPU: checked here, not printed
    print(f"m - n = {m - n:>2}: score at shifts 0, 10, 100, 1000 varies by less than 1e-3: {spread < 1e-3}")
print("different offsets give different scores:", abs(rotary_score(q, k, 5, 2) - rotary_score(q, k, 40, 10)) > 1e-2)

# %% [markdown]
# ### Angles a model never saw in training
#
# The pairs turn at very different speeds. Below, the angle $m\theta_i$ (modulo a full turn) of a fast and a
# slow pair of our head ($d = 32$) against the position $m$; the shaded positions are those a model trained at
# length $L = 64$ sees.

# %%
theta = 10000.0 ** (-2 * torch.arange(head_size // 2, dtype=torch.float64) / head_size)   # (d/2,)
fast, slow = 0, int((TRAIN_LENGTH * theta - 1).abs().argmin())    # the slow pair: about 1 rad at position L
positions_long = torch.arange(LONG, dtype=torch.float64)
angle = {pair: (positions_long * theta[pair]) % (2 * math.pi) for pair in (fast, slow)}
seen = angle[slow][:TRAIN_LENGTH].max().item()                   # the slow pair's largest angle in training
fig, ax = plt.subplots(figsize=(11, 3.8), layout="constrained")
ax.axvspan(0, TRAIN_LENGTH - 1, color="#888888", alpha=0.25, label=f"positions in training (0..{TRAIN_LENGTH - 1})")
ax.axhspan(0, seen, color="#E69F00", alpha=0.2, label=f"angles pair {slow} reached in training")
ax.plot(positions_long, angle[fast], linestyle="none", marker=".", markersize=3, color="#D55E00",
        label=f"fast pair {fast}: θ = {theta[fast]:.3g} rad")
ax.plot(positions_long, angle[slow], linewidth=2, color="#0072B2",
        label=f"slow pair {slow}: θ = {theta[slow]:.3g} rad")
ax.set(xlabel="position m", ylabel=r"angle $m\theta_i$ mod $2\pi$ (rad)", xlim=(0, LONG - 1), ylim=(0, 2 * math.pi),
       title="RoPE's rotation angles: the slow pair leaves the range it was trained on")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
plt.show()
fast_turns = TRAIN_LENGTH * theta[fast].item() / (2 * math.pi)
print(f"fast pair {fast}: {fast_turns:.1f} full turns inside the training length: every angle seen")
print(f"slow pair {slow}: angles 0..{seen:.2f} rad in training, up to {angle[slow].max():.2f} rad at length {LONG}")
assert fast_turns > 5 and angle[slow].max() > 2 * seen          # the claims of the text below

# %% [markdown]
# The fast pair goes round the circle every few positions: a model sees all of its angles within the first few
# dozen tokens. The slow pair turns so slowly that in training it covers only the orange band; beyond the
# shaded positions it sweeps through angles the model never met, so the scores built on it mean something the
# model was never trained on. This is RoPE's weak point beyond $L$; notebook 03 measures what it costs.
#
# RoPE also has a built-in **long-term decay** (Su et al., §3.4.3): for $q = k = \mathbf{1}$ the score is
# $\sum_i 2\cos\big((m-n)\theta_i\big)$, which oscillates and shrinks as the distance grows, because the slow
# pairs are few. The dashed line marks the training length.

# %%
ones = torch.ones(head_size, device=DEVICE)
distances = torch.arange(0, LONG)
decay = [rotary_score(ones, ones, int(d), 0) for d in distances]
plt.figure(figsize=(8, 3.5))
plt.plot(distances, decay, linewidth=1, label=r"$\langle R_m \mathbf{1}, R_n \mathbf{1}\rangle$")
plt.axvline(TRAIN_LENGTH, color="#888888", linestyle="--", label=f"training length {TRAIN_LENGTH}")
plt.xscale("symlog", linthresh=8)
plt.xlim(0, LONG)
plt.xlabel("relative distance m - n (linear to 8, then logarithmic)")
plt.ylabel("score")
plt.title(f"RoPE's long-term decay (head size {head_size})")
plt.legend()
plt.show()

# %% [markdown]
# ### Exercise 1.2 (derive) · RoPE's score in closed form
#
# The curve above is one special case. Derive the general one: for any query $q$ and key $k$ of head size $d$,
# write $\langle R_t q, R_0 k\rangle$ (the query $t$ positions after the key) as a sum over the $d/2$ channel
# pairs of terms in $\cos(t\theta_i)$ and $\sin(t\theta_i)$, $\theta_i = 10000^{-2i/d}$. minidape's
# `apply_rotary` pairs channel $i$ with channel $i + d/2$ and rotates the pair $(x_1, x_2)$ by the angle
# $\alpha$ to $(x_1\cos\alpha - x_2\sin\alpha,\ x_1\sin\alpha + x_2\cos\alpha)$. Then write
# `rope_score(q, k, t)` from your formula, **without** calling minidape. The check draws new random $q$, $k$
# and $t$ each time it runs and compares with minidape's rotation.

# %%
def rope_score(q, k, t):
    """<R_t q, R_0 k> for float64 vectors q, k of even size d, from your closed form (a float)."""
    exercises.todo()                      # your code here


# %% tags=["solution"]
def rope_score(q, k, t):
    """<R_t q, R_0 k> for float64 vectors q, k of even size d, from your closed form (a float)."""
    # Pair i: (q1 cos - q2 sin) k1 + (q1 sin + q2 cos) k2 = cos(tθ_i)(q1 k1 + q2 k2) + sin(tθ_i)(q1 k2 - q2 k1).
    half = len(q) // 2
    theta = 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / len(q))      # (d/2,)
    q1, q2, k1, k2 = q[:half], q[half:], k[:half], k[half:]
    return (torch.cos(t * theta) * (q1 * k1 + q2 * k2) + torch.sin(t * theta) * (q1 * k2 - q2 * k1)).sum().item()


# %%
exercises.check("rope_score", rope_score)

# %% [markdown]
# ### YaRN: RoPE that changes its frequencies beyond the training length
#
# `yarn` (Peng et al., 2023, §3.2–3.4) is RoPE during training. At inference with $T > L$ (= `block_size`) and
# $s = T/L$ it interpolates the slow pairs, $\theta_i \mapsto \theta_i/s$, leaves the fast pairs alone and
# blends in between with a ramp $\gamma_i$; it also scales the logits by $(0.1\ln s + 1)^2$ (a temperature).
# So the same weights give **exactly** RoPE's logits up to the training length, and different ones beyond.

# %%
# NBVAL_CHECK_OUTPUT
rope_model = md.GPT(tiny_config("rope")).to(DEVICE).eval()
yarn_model = md.GPT(tiny_config("yarn")).to(DEVICE).eval()
yarn_model.load_state_dict(rope_model.state_dict())   # the rotary modules have no parameters: same weights
tokens = torch.randint(0, 256, (1, 4 * TRAIN_LENGTH), generator=generator).to(DEVICE)
with torch.no_grad():
    for T in (TRAIN_LENGTH // 2, TRAIN_LENGTH, 2 * TRAIN_LENGTH, 4 * TRAIN_LENGTH):
        same = torch.equal(rope_model(tokens[:, :T])[0], yarn_model(tokens[:, :T])[0])
        _, temperature = yarn_model.pe.frequencies_and_scale(T)
        print(f"T = {T:>3}: YaRN logits == RoPE logits: {str(same):<5}  cos/sin scale 0.1 ln s + 1 = {temperature:.4f}")

# %%
yarn = yarn_model.pe
pairs = torch.arange(head_size // 2)
plt.figure(figsize=(8, 3.5))
for T in sorted({TRAIN_LENGTH, 2 * TRAIN_LENGTH, 4 * TRAIN_LENGTH, LONG}):   # a set: LONG is 4L in quick mode
    yarn_theta, _ = yarn.frequencies_and_scale(T)
    plt.plot(pairs, (yarn_theta / yarn.theta).cpu(), marker="o", markersize=3, label=f"T = {T} (s = {T / TRAIN_LENGTH:g})")
plt.yscale("log", base=2)
plt.xlabel("rotary pair i (fast → slow)")
plt.ylabel(r"$\theta'_i / \theta_i$")
plt.title("YaRN: slow pairs are interpolated by 1/s, fast pairs keep their frequency")
plt.legend()
plt.show()

# %% [markdown]
# ## 4. Additive biases: a matrix $B$ per head, added to the scores
#
# The rest of the family adds $b_h(m, n)$ to the scaled scores of head $h$, the same in every layer (Press et
# al. call this "attention with linear biases"; Kerple derives the general form, notebook 02):
#
# | pe | $b_h(m, n)$, $m \ge n$ | parameters per model |
# |---|---|---|
# | `alibi` | $-s_h\,(m-n)$, fixed slopes $s_h = 2^{-8h/H}$ | 0 |
# | `kerple_log` | $-r_1^{(h)}\ln\big(1 + r_2^{(h)}(m-n)\big)$ | $2H$ |
# | `kerple_power` | $-a^{(h)}(m-n)^{p^{(h)}}$, $0 < p \le 2$ | $2H$ |
# | `t5` | learned value of the log-spaced bucket of $m-n$ (32 buckets, max distance 128) | $32H$ |
# | `fire` | MLP of $\psi(m-n)/\psi(\max(m, L))$, $\psi(x) = \ln(c\,x + 1)$ (Li et al., 2023) | a small MLP + 2 |
#
# The bias module maps two position vectors to `(n_head, Tq, Tk)`; `md.plots.plot_bias` draws one panel per
# head.
# These are the **initial** biases (Kerple's $r_1, r_2, a, p$ start random, T5's table near zero, FIRE's MLP
# random); training reshapes them (notebook 03). Above the diagonal is the future, hidden by the causal mask:
# those cells are left blank, since no query ever uses them.

# %%
models = {name: md.GPT(tiny_config(name)).to(DEVICE) for name in md.PE_NAMES}
bias_models = {name: model for name, model in models.items() if isinstance(model.pe, AdditiveBias)}
positions = torch.arange(32, device=DEVICE)
future = torch.ones(32, 32, dtype=torch.bool).triu(1)                 # masked cells: j > i


def visible_only(bias):
    """The bias with the causally masked cells (j > i) set to NaN, which the heatmaps leave blank."""
    return bias.detach().cpu().masked_fill(future[: bias.shape[-2], : bias.shape[-1]], float("nan"))


for name, model in bias_models.items():
    with torch.no_grad():
        bias = model.pe(positions, positions)
    md.plots.plot_bias(visible_only(bias), title=f"{name}: initial bias b_h(i, j), 32 positions")
    plt.show()

# %% [markdown]
# ### Exercise 1.3 (implement) · ALiBi's bias
#
# Write `alibi_bias(n_head, q_pos, k_pos)` returning the `(n_head, len(q_pos), len(k_pos))` bias
# $b_h(i, j) = -s_h\,(i - j)$ with ALiBi's slopes $s_h = 2^{-8h/H}$, $h = 1..H$ (for $H$ a power of two). Only
# the cells with $j \le i$ are compared with minidape's `alibi` module (the others are masked anyway).

# %%
def alibi_bias(n_head, q_pos, k_pos):
    """ALiBi's bias (n_head, Tq, Tk) for LongTensor positions q_pos (Tq,) and k_pos (Tk,)."""
    exercises.todo()                      # your code here


# %% tags=["solution"]
def alibi_bias(n_head, q_pos, k_pos):
    """ALiBi's bias (n_head, Tq, Tk) for LongTensor positions q_pos (Tq,) and k_pos (Tk,)."""
    slopes = torch.tensor([2.0 ** (-8 * h / n_head) for h in range(1, n_head + 1)])          # (h,)
    distance = (q_pos[:, None] - k_pos[None, :]).clamp(min=0).float()                      # (Tq, Tk)
    return -slopes[:, None, None] * distance


# %%
exercises.check("alibi_bias", alibi_bias)

# %% [markdown]
# Where does $B$ go? `model.attention_maps(idx, layer)` returns a layer's pieces: the scaled scores
# $S = QK^\top/\sqrt{d}$, the bias, the `refined` scores that reach the mask and softmax, and the attention
# probabilities. Without a refiner, `refined` is exactly $S + B$:

# %%
# NBVAL_CHECK_OUTPUT
model = bias_models["kerple_log"].eval()
maps = model.attention_maps(tokens[:, :32], layer=1)
print({name: tuple(value.shape) for name, value in maps.items()})
print("refined == scores + bias:", torch.allclose(maps["refined"], maps["scores"] + maps["bias"]))

# %% [markdown]
# ### Exercise 1.4 (experiment) · How spread out is ALiBi's attention far beyond training?
#
# Take a query at position $T - 1 = 1023$ (16× the training length) and keys $0 \dots 1023$, with content
# scores $q^\top k = 0$ (an untrained model is close to that), so that the attention of head $h$ is the softmax
# of ALiBi's bias row alone, with $H = 4$ heads. Its **entropy** $-\sum_j p_j \ln p_j$ (in nats) says how many
# keys it really reads: $\ln 1024 = 6.93$ for uniform attention over all keys, 0 for a single key.
#
# **Predict first**: the entropy averaged over the 4 heads, as a number, in the cell below, *before* you run
# the measurement. (Reason with the slopes $2^{-2}, 2^{-4}, 2^{-6}, 2^{-8}$: a head with slope $s$ lets its
# weights fall by a factor $e$ every $n = 1/s$ keys. Such weights are about as spread out as $e \cdot n$ equally
# weighted keys, not $n$: more than a third of the weight lies beyond the first $n$ keys. And $N$ equally weighted
# keys have entropy $\ln N$.) A prediction within ±0.5 nats of the measurement earns its point.

# %% tags=["prediction"]
entropy_prediction = None                 # your prediction (nats), written before the measurement


# %% tags=["solution", "prediction"]
entropy_prediction = 4.4                  # softmax(-s d) is geometric: entropy ≈ 1 + ln(1/s) nats per head


# %% [markdown]
# Now measure it: set `entropy_measured` to the mean over heads of the entropy of the last query's attention,
# using your `alibi_bias` (or minidape's `alibi` module if yours has not passed yet). Do not print it: the
# check reveals it next to your prediction.

# %%
entropy_measured = None                   # your measurement (nats)


# %% tags=["solution"]
query, keys = torch.tensor([1023]), torch.arange(1024)
if exercises.passed("alibi_bias"):
    row = alibi_bias(4, query, keys)                                        # (heads, 1, keys)
else:                                                                       # minidape's ALiBi until yours passes
    row = md.GPT(tiny_config("alibi")).pe(query, keys)
attention = row[:, 0].double().softmax(-1)                                  # (heads, keys)
entropy_measured = -(attention * attention.log()).sum(-1).mean().item()


# %%
exercises.check("alibi_entropy", entropy_prediction, entropy_measured)

# %% [markdown] tags=["written", "rubric:alibi_entropy"]
# **Your answer** (two or three sentences): which head is closest to uniform attention, and why? What does the
# entropy say about how many of the 1024 keys ALiBi lets a query read, however long the input gets?

# %% [markdown] tags=["solution"]
# **Worked answer.** Head 4 (slope $2^{-8}$) is closest to uniform: its weights fall by $e$ only every 256 keys,
# so it spreads over a few hundred of them (entropy ≈ 6.5 of the 6.93 possible). Head 1 (slope 1/4) reads
# about $e^{2.4} \approx 11$ keys. The entropy of each head is fixed by its slope, not by $T$: beyond a few
# hundred keys, a longer input adds keys with vanishing weight, so ALiBi keeps every query's view as local as
# it was in training — its built-in window, and the reason it extrapolates (and cannot use far context).

# %% [markdown]
# ## 5. Beyond the training length
#
# A bias is a *function of positions*, so it can be evaluated at any length. What it does there is the whole
# story of extrapolation. Below: the last query row $i = T - 1$ of each bias at $T$ = `LONG`, as a function of
# the distance $i - j$, for head 0 (the distance axis is logarithmic; the dashed line is the training length).
#
# * ALiBi and Kerple-power keep **decreasing without bound**: far tokens are pushed out of the softmax, a
#   built-in local window.
# * Kerple-log decays only **logarithmically**: far tokens stay reachable.
# * T5 is **flat beyond distance 128**: every long distance shares the last bucket.
# * FIRE **rescales** distances by $\psi(\max(i, L))$: beyond the threshold the whole row is squeezed into the
#   range seen in training, so its curve at $i = T-1$ differs from the one at $i = L - 1$ (thin line).

# %%
fig, axes = plt.subplots(1, len(bias_models), figsize=(4 * len(bias_models), 3.5))
long_positions = torch.arange(LONG, device=DEVICE)
for ax, (name, model) in zip(axes, bias_models.items()):
    with torch.no_grad():
        row = model.pe(long_positions[-1:], long_positions)[0, 0].cpu()        # head 0, query LONG - 1
        train_row = model.pe(long_positions[TRAIN_LENGTH - 1:TRAIN_LENGTH], long_positions[:TRAIN_LENGTH])[0, 0].cpu()
    ax.plot(torch.arange(LONG).flip(0), row, label=f"query {LONG - 1}")
    ax.plot(torch.arange(TRAIN_LENGTH).flip(0), train_row, linewidth=0.8, label=f"query {TRAIN_LENGTH - 1}")
    ax.axvline(TRAIN_LENGTH, color="gray", linestyle="--", linewidth=1, label="training length")
    ax.set_xscale("symlog", linthresh=1)
    ax.set(title=name, xlabel="distance i - j", xlim=(0, LONG))
axes[0].set_ylabel("bias, head 0")
axes[0].legend(fontsize="small")
plt.suptitle("Initial biases far beyond the training length")
plt.tight_layout()
plt.show()

# %% [markdown]
# And the whole model: every encoding except `learned` runs at `LONG` (here 16× the training length in full
# mode). Running is not the same as extrapolating *well* — that is measured in notebook 03 — but it is the
# precondition. The last column is the entropy of layer 0's attention for the last query, in nats (mean over
# heads): a uniform distribution over all $T$ keys has $\ln T$. At initialisation the content scores
# $q^\top k$ are nearly zero, so encodings without a bias (and T5 and FIRE, whose initial biases are nearly
# flat) attend almost uniformly to a thousand keys; ALiBi's and Kerple's decaying biases already concentrate
# attention on recent keys — the mechanism by which biases keep long inputs looking like short ones.

# %% tags=["reveals-prediction"]
tokens = torch.randint(0, 256, (1, LONG), generator=generator).to(DEVICE)
print(f"T = {LONG} = {LONG // TRAIN_LENGTH} x block_size;  ln T = {torch.log(torch.tensor(float(LONG))):.2f}")
for name in md.PE_NAMES:
    model = md.GPT(tiny_config(name)).to(DEVICE).eval()
    try:
        logits, _ = model(tokens)
        probs = model.attention_maps(tokens, layer=0)["probs"][0, :, -1]     # (heads, keys)
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean().item()
        print(f"{name:<13} runs, logits {tuple(logits.shape)}, attention entropy of the last query {entropy:5.2f}")
    except ValueError as error:
        print(f"{name:<13} ValueError: {str(error)[:90]}...")

# %% [markdown]
# ## 6. Randomized positions (Ruoss et al., 2023)
#
# `random_positions=L` attacks the problem from the training side: each training batch gets a **sorted random
# subset** of $\{0, \dots, L-1\}$ as its positions instead of $0, \dots, T-1$. The model then meets large
# positions and distances during training although its sequences are short. Evaluation uses plain positions.
# It works with any encoding that reads positions (a learned table gets $L$ rows).

# %%
# NBVAL_CHECK_OUTPUT
torch.manual_seed(0)
# On the CPU whatever DEVICE is: the positions are drawn from the CPU's random generator, the same on every
# machine, so this checked output is too.
model = md.GPT(tiny_config("learned", block_size=8, random_positions=64))
model.train()
print("training positions, batch 1:", model.positions(8, "cpu").tolist())
print("training positions, batch 2:", model.positions(8, "cpu").tolist())
model.eval()
print("evaluation positions:       ", model.positions(8, "cpu").tolist())
print("learned table rows:", model.pe.table.num_embeddings)
try:
    md.GPTConfig(block_size=64, random_positions=32)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ## 7. Register your own encoding
#
# `md.register_pe(name)` adds a class to the registry; `GPTConfig(pe=name)` then builds it, and it works with
# every refiner. A bias subclasses `md.AdditiveBias` and maps query and key positions to `(n_head, Tq, Tk)`.
# Here: ALiBi with **learnable** slopes, kept positive by a softplus. (Notebook 06 is the full assignment.)

# %%
if "learned_slopes" not in md.PE_NAMES:   # registering a name twice is an error: guard re-runs of this cell

    @md.register_pe("learned_slopes")
    class LearnedSlopes(md.AdditiveBias):
        r"""$b_h(i, j) = -\mathrm{softplus}(w_h)\,(i - j)$: ALiBi's shape, slopes learned per head."""

        def __init__(self, cfg):
            super().__init__()
            self.w = torch.nn.Parameter(torch.linspace(-3.0, 0.0, cfg.n_head))

        def forward(self, q_pos, k_pos):
            distance = torch.relu(q_pos[:, None] - k_pos[None, :]).float()      # i - j on visible keys, 0 above
            return -torch.nn.functional.softplus(self.w)[:, None, None] * distance

# %%
# NBVAL_CHECK_OUTPUT
model = md.GPT(tiny_config("learned_slopes", refiner="dape")).to(DEVICE)
logits, loss = model(tokens[:, :TRAIN_LENGTH], targets=tokens[:, 1:TRAIN_LENGTH + 1])
loss.backward()
print("registered:", "learned_slopes" in md.PE_NAMES, "| logits", tuple(logits.shape),
      "| slope gradients flow:", bool(model.pe.w.grad.abs().sum() > 0))
try:
    md.register_pe("alibi")(type(model.pe))
except ValueError as error:
    print("ValueError:", error)
with torch.no_grad():
    md.plots.plot_bias(visible_only(model.pe(positions, positions)), title="learned_slopes: initial bias")
plt.show()

# %% [markdown]
# ## Summary
#
# * Absolute encodings add a vector to the input; `learned` stops at its table, `sinusoidal` runs anywhere but
#   its positions beyond training were never seen.
# * RoPE makes scores depend on $m - n$ exactly; at long range its slow rotations leave the trained range, and
#   YaRN's interpolation kicks in only when $T > L$.
# * Biases are functions of the distance: ALiBi and Kerple-power decay without bound (local attention),
#   Kerple-log slowly, T5 saturates at 128, FIRE rescales by the query position.
# * Next: notebook 02 derives the bias family from conditionally positive definite kernels (Kerple).

# %%
exercises.summary("01")
