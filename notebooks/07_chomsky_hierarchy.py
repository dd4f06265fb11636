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
# # 07 · The Chomsky hierarchy: length generalisation on formal-language tasks
#
# Perplexity (notebooks 03–06) tells us whether a language model *stays fluent* beyond its training length.
# It does not tell us whether the model *computes the right thing* there. The DAPE paper (§4.7, Appendix D,
# Table 2) and the DAPE-V2 paper (Appendix G, Table 6) therefore also test on the **Chomsky-hierarchy
# evaluation (CHE)** of Delétang et al. (2023): 15 algorithmic tasks on formal languages (reverse a string,
# sort it, add two binary numbers, ...). Each task has an exact answer, so accuracy is unambiguous.
#
# The protocol comes from Ruoss et al. (2023, *Randomized positional encodings*):
#
# - **Train** on input lengths $n \sim U\{1, \dots, 40\}$, one $n$ per step for the whole batch.
# - **Test** on $n = 41, \dots, 500$: up to 12× longer than anything seen in training.
# - **Score**: per-token accuracy over the answer positions, averaged per length, then over the test lengths.
#
# This notebook shows the 15 tasks and their levels, the encoder set-up, why some tasks need no positional
# information, and compares ALiBi, Kerple, DAPE-Kerple and DAPE1x3-Kerple (DAPE-V2) on two tasks.
#
# **A word on budget.** The papers train 5-layer, 256-wide encoders for 200k steps and test every length up
# to 500. Here each model has 2 layers, 64 channels and trains for 1000 steps on a shared 2-core
# CPU, and we test up to length 200. That is enough to see the *shape* of the results, not to reproduce the
# papers' numbers; section 6 adds a larger run made with the command line on a GPU.
#
# **Cost.** Trains eight encoders (four models × two tasks, 1000 steps of 32 sequences each) and tests each at
# 20 lengths. This is the longest notebook of the series: full mode takes about 10 min
# (597 s measured on a 2-core AMD EPYC CPU shared with other jobs); a GPU runs the same budget much faster.
#
# **Exercises:** 7.1 implement a task generator (`binary_addition`) and check it against the task's definition
# (3 points); 7.2 derive the answer length of five tasks (2); 7.3 implement the benchmark's accuracy with the
# `END` mask (2); 7.4 experiment: predict, then measure, which models cannot see the order of their input (2:
# the measurement and the prediction), with a written answer.

# %%
import dataclasses
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import minidape as md
from minidape import exercises, notebook

RUN = notebook.start()       # seeds torch, one CPU thread (tiny models), the clock of the run time printed at the end
QUICK = RUN.quick            # MINIDAPE_QUICK=1 (CI): fewer steps and lengths, the same code

MAX_TRAIN_LENGTH = 40                                   # training inputs: n ~ U{1..40}, as in the papers
STEPS = 30 if QUICK else 1000                            # Adam steps per model (the papers: 200k)
BATCH = 16 if QUICK else 32                              # sequences per step
TEST_LENGTHS = [10, 40, 60] if QUICK else list(range(10, 201, 10))   # 10..40 in training, 50..200 beyond
EVAL_SAMPLES = 8 if QUICK else 48                        # test sequences per length
SIZE = dict(n_layer=2, n_embd=64, n_head=4)             # ~0.1M parameters

print(RUN, f"| {STEPS} steps of {BATCH} sequences, test lengths "
      f"{TEST_LENGTHS[0]}..{TEST_LENGTHS[-1]}, {EVAL_SAMPLES} sequences each")

# %%
# DEVICE: every model and tensor of this notebook lives here: CUDA if there is a GPU, then Apple's MPS, then the CPU.
DEVICE = notebook.device()
print("device:", DEVICE)

# %% [markdown]
# ## 1. Fifteen tasks on three levels of the hierarchy
#
# Delétang et al. sort the tasks by the weakest automaton that solves them for *every* length:
#
# - **Regular (R)**: a finite-state automaton suffices (a fixed amount of memory). Parity of the number of
#   1s, the sum of moves on a 5-cycle, an arithmetic expression mod 5 evaluated left to right.
# - **Deterministic context-free (DCF)**: a finite-state automaton with a stack. Reversing a string, running
#   stack instructions, evaluating a bracketed expression.
# - **Context-sensitive (CS)**: a finite-state automaton with a bounded tape, i.e. random access to memory
#   of size $O(n)$. Duplicating a string, binary addition and multiplication, square roots, sorting.
#
# `md.tasks` generates each task as in the benchmark's code: the same alphabets, answer lengths and sampling
# distributions, with every random number drawn from a `torch.Generator` we pass in. The table shows one
# sample of input length 8 per task (an answer padded after its `END` token shows the padding too).

# %%
# NBVAL_CHECK_OUTPUT
def show(task, ids, symbols):
    separator = "" if all(len(s) == 1 for s in symbols) else " "
    return separator.join(symbols[i] for i in ids)


print(f"{'task':<28} {'level':<18} {'in':>3} {'out':>3} {'chance':>6}   example (n = 8) -> answer")
for name in md.tasks.TASK_NAMES:
    task = md.tasks.get_task(name)
    n = task.valid_length(8)
    inputs, targets = task.sample(1, n, torch.Generator().manual_seed(0))
    example = f"{show(task, inputs[0].tolist(), task.input_symbols)} -> " \
              f"{show(task, targets[0].tolist(), task.output_symbols)}"
    print(f"{name:<28} {task.level:<18} {task.input_vocab:>3} {task.output_vocab:>3} "
          f"{task.chance_accuracy:>6.0%}   {example}")

# %% [markdown]
# A few conventions worth knowing (all documented in `md.tasks`):
#
# - The answer has `task.output_length(n)` tokens, enough for the longest answer of any input of length $n$
#   (exercise 7.2 derives it). Tasks whose answers have variable length (`stack_manipulation`, the binary
#   operations, little-endian) end them with an `END` token followed by padding; `compute_sqrt` is big-endian
#   and zero-padded.
# - `modular_arithmetic` (the "simple" one of the papers' tables) needs odd lengths and uses the usual
#   precedence ($\times$ before $+$ and $-$); `modular_arithmetic_brackets` is the fully bracketed, context-free
#   version. Both work mod 5, so chance is 20%.
# - `odds_first`: the benchmark's docstring and its code disagree on the order; we follow the code, which
#   produced the published numbers (symbols at odd 0-based indices first).
#
# ### Exercise 7.1 (implement) · A task generator
#
# Write `addition_sample(batch_size, n, generator)` for `binary_addition` (its row in the table above), from
# its definition. Each input row holds two **non-zero** binary numbers $a$ and $b$, little-endian (bit $i$ worth
# $2^i$), separated by one operator `+` (id 2) at a random position, so that their lengths are random and add
# up to $n - 1$ (each at least one bit). The answer row has $n + 1$ tokens: the bits of $a + b$, little-endian
# and without trailing zeros, then `END` (id 2), then 0s. Draw everything from the `torch.Generator` you are
# given (the same seed must give the same batch). The check parses your inputs, recomputes every answer, and
# names the mistakes it recognises.

# %%
def addition_sample(batch_size, n, generator):
    """(inputs (batch_size, n), targets (batch_size, n + 1)) of the binary_addition task."""
    exercises.todo()                      # your code here


# %% tags=["solution"]
def addition_sample(batch_size, n, generator):
    """(inputs (batch_size, n), targets (batch_size, n + 1)) of the binary_addition task."""
    inputs = torch.zeros(batch_size, n, dtype=torch.long)
    targets = torch.zeros(batch_size, n + 1, dtype=torch.long)                # padding: 0
    for row in range(batch_size):
        split = int(torch.randint(1, n - 1, (1,), generator=generator))       # a has `split` bits, b the rest
        bits = torch.randint(0, 2, (n,), generator=generator)
        while not (bits[:split].any() and bits[split + 1:].any()):            # both operands non-zero
            bits = torch.randint(0, 2, (n,), generator=generator)
        bits[split] = 2                                                       # the operator '+'
        a = sum(int(bit) << i for i, bit in enumerate(bits[:split]))          # little-endian
        b = sum(int(bit) << i for i, bit in enumerate(bits[split + 1:]))
        answer = [int(bit) for bit in reversed(format(a + b, "b"))] + [2]     # the sum little-endian, then END
        inputs[row], targets[row, :len(answer)] = bits, torch.tensor(answer)
    return inputs, targets


# %%
exercises.check("addition_sample", addition_sample)

# %% [markdown]
# ### Exercise 7.2 (derive) · How long is the answer?
#
# From what each task computes, write `output_length(name, n)`, the number of answer tokens for an input of
# length $n$, for `reverse_string`, `duplicate_string`, `compute_sqrt` (the integer square root of an $n$-bit
# number: how many bits can it have?), `binary_multiplication` (the input holds both numbers, little-endian, and
# one operator symbol; the answer ends with `END`) and `parity_check`. The check compares with `md.tasks` for
# lengths it draws anew each time it runs.

# %%
def output_length(name, n):
    """The answer length of task `name` for input length n."""
    exercises.todo()                      # your code here


# %% tags=["solution"]
def output_length(name, n):
    """The answer length of task `name` for input length n."""
    return {"reverse_string": n, "duplicate_string": 2 * n,
            "compute_sqrt": math.ceil(n / 2),        # sqrt(x) < 2^(n/2) for x < 2^n
            "binary_multiplication": n,              # a·b has at most len(a) + len(b) = n - 1 bits, then END
            "parity_check": 1}[name]                 # a classification: one answer token


# %%
exercises.check("output_length", output_length)

# %% [markdown] tags=["solution"]
# The lengths, for reference: 1 for classification tasks, $n$ for `reverse_string` and `odds_first`, $2n$ for
# `duplicate_string`, $\lceil n/2 \rceil$ for `compute_sqrt`, $n$ for `binary_multiplication`, and $n + 1$ for
# `stack_manipulation` and `binary_addition` (the benchmark's convention leaves one token more than the longest
# sum needs).

# %% [markdown]
# ## 2. The encoder set-up: answers read from placeholder positions
#
# Ruoss et al. use a bidirectional encoder (`causal=False`), not a language model. The input is followed by
# `output_length(n)` **placeholder** tokens (one extra input id), and the model's outputs *at those positions*
# are its answer, all produced in one forward pass, without autoregressive sampling. Training uses
# cross-entropy on the placeholder positions only (`md.tasks.encoder_targets` marks the others with -1).

# %%
# NBVAL_CHECK_OUTPUT
task = md.tasks.get_task("reverse_string")
inputs, targets = task.sample(1, 6, torch.Generator().manual_seed(1))
print("input ids      ", inputs[0].tolist())
print("encoder input  ", md.tasks.encoder_inputs(inputs, task)[0].tolist(), f"  (placeholder id {task.placeholder_token})")
print("training labels", md.tasks.encoder_targets(targets, 6)[0].tolist(), "  (-1: not scored)")
print("model vocabulary", task.model_vocab_size, "| config:", md.che.task_config(task, md.GPTConfig(**SIZE)).causal,
      "= causal")

# %% [markdown]
# For tasks with an `END` token only the answer up to and including the first `END` is scored: predicting
# the padding after it is not part of the task. `md.tasks.accuracy` applies that mask:

# %%
# NBVAL_CHECK_OUTPUT
stack = md.tasks.get_task("stack_manipulation")
END = stack.end_token
targets = torch.tensor([[1, 0, END, 0, 0, 0]])
guess = torch.tensor([[1, 1, END, 1, 1, 1]])        # one mistake before END, garbage after it
logits = torch.nn.functional.one_hot(guess, stack.output_vocab).float()
print("scored positions:", md.tasks.output_mask(targets, stack)[0].tolist())
print(f"accuracy: {md.tasks.accuracy(logits, targets, stack).item():.3f}  (2 of 3 scored tokens right)")

# %% [markdown]
# ### Exercise 7.3 (implement) · Accuracy with the `END` mask
#
# Write `masked_accuracy(logits, targets, end_token)`: `logits` `(batch, L, C)`, `targets` `(batch, L)`; a position of a
# row is scored when no `END` occurs **before** it (the first `END` itself is scored; a row without `END` is
# scored everywhere); return (correct argmax predictions on scored positions, summed over the batch) / (scored
# positions, summed over the batch) as a float. The check compares with `md.tasks.accuracy` on random logits.

# %%
def masked_accuracy(logits, targets, end_token):
    """Per-token accuracy over the scored answer positions of a batch (a float)."""
    exercises.todo()                      # your code here


# %% tags=["solution"]
def masked_accuracy(logits, targets, end_token):
    """Per-token accuracy over the scored answer positions of a batch (a float)."""
    is_end = (targets == end_token).int()                           # (batch, L)
    scored = (is_end.cumsum(dim=1) - is_end) == 0                   # no END strictly before this position
    correct = (logits.argmax(dim=-1) == targets) & scored
    return (correct.sum() / scored.sum()).item()


# %%
exercises.check("masked_accuracy", masked_accuracy)

# %% [markdown]
# ## 3. Permutation-invariant tasks need no positions
#
# Table 2 of the DAPE paper marks `parity_check`, `cycle_navigation` and `bucket_sort` as
# *permutation-invariant*: shuffling the input does not change the answer, which depends only on how many
# times each symbol occurs. Such a task needs no positional information about the input. Which models *cannot*
# see the order of their input at all?
#
# ### Exercise 7.4 (experiment), part 1 · Predict
#
# Take an untrained model on `parity_check` with the answer placeholder after the input, shuffle the input part
# (the placeholder stays last) and compare the answer logits before and after. For each of the four cases of
# `exercises.SHUFFLE_CASES` — NoPE in an encoder (`causal=False`, as in this notebook), NoPE in a decoder
# (`causal=True`), ALiBi and RoPE in an encoder — predict: are the answer logits **unchanged** (`True`) or not?

# %%
print(list(exercises.SHUFFLE_CASES))

# %% tags=["prediction"]
unchanged_prediction = None               # {"none, encoder": True or False, ...}, written before the measurement


# %% tags=["solution", "prediction"]
unchanged_prediction = {"none, encoder": True,     # attention without positions is permutation-equivariant
                        "none, decoder": False,    # the causal mask: each token sees a different prefix
                        "alibi, encoder": False, "rope, encoder": False}


# %% [markdown]
# ### Exercise 7.4 (experiment), part 2 · Measure
#
# `answer_unchanged(pe, causal)` runs the comparison for one case. Set `unchanged_measured` to the dict of its
# results for the four cases, without printing it: the check reveals it next to your prediction.

# %%
def answer_unchanged(pe, causal):
    """Whether an untrained model's answer logits on parity_check stay the same when the input is shuffled."""
    task = md.tasks.get_task("parity_check")
    inputs, _ = task.sample(4, 30, torch.Generator().manual_seed(2))
    shuffled = inputs[:, torch.randperm(30, generator=torch.Generator().manual_seed(3))]
    torch.manual_seed(0)
    cfg = dataclasses.replace(md.che.task_config(task, md.GPTConfig(pe=pe, **SIZE)), causal=causal)
    model = md.GPT(cfg).to(DEVICE).eval()
    with torch.no_grad():
        before = model(md.tasks.encoder_inputs(inputs, task).to(DEVICE))[0][:, -1]
        after = model(md.tasks.encoder_inputs(shuffled, task).to(DEVICE))[0][:, -1]
    return torch.allclose(before, after, atol=1e-5)


unchanged_measured = None                 # your measurement


# %% tags=["solution"]
unchanged_measured = {case: answer_unchanged(pe, causal) for case, (pe, causal) in exercises.SHUFFLE_CASES.items()}


# %%
exercises.check("shuffle_invariance", unchanged_prediction, unchanged_measured)

# %% [markdown]
# Why. An encoder **without** positional encoding (`pe="none"`, NoPE) is exactly suited to a permutation-invariant
# task. Self-attention without positions is permutation-equivariant: for a permutation matrix $P$ of the tokens,
# $\mathrm{softmax}\big((PQ)(PK)^\top\big)(PV) = P\,\mathrm{softmax}(QK^\top)V$, and the MLPs act on each token
# alone. So if we shuffle the input part and leave the placeholders where they are, the outputs at the
# placeholders cannot change at all. A decoder's causal mask breaks the symmetry (token $t$ sees only tokens
# before it), and ALiBi's and RoPE's positions break it too. The same comparison for NoPE and ALiBi:

# %% tags=["reveals-prediction"]
# NBVAL_CHECK_OUTPUT
task = md.tasks.get_task("parity_check")
inputs, _ = task.sample(4, 30, torch.Generator().manual_seed(2))
shuffled = inputs[:, torch.randperm(30, generator=torch.Generator().manual_seed(3))]
for pe in ("none", "alibi"):
    torch.manual_seed(0)
    model = md.GPT(md.che.task_config(task, md.GPTConfig(pe=pe, **SIZE))).to(DEVICE).eval()
    with torch.no_grad():
        before = model(md.tasks.encoder_inputs(inputs, task).to(DEVICE))[0][:, -1]
        after = model(md.tasks.encoder_inputs(shuffled, task).to(DEVICE))[0][:, -1]
    print(f"pe={pe!r:8} answer logits unchanged by shuffling the input: {torch.allclose(before, after, atol=1e-5)}")

# %% [markdown] tags=["written", "rubric:shuffle_invariance"]
# **Your answer** (two or three sentences): if NoPE cannot see the order of its input, why can it still not
# solve `bucket_sort` (whose answer does not depend on the input order either)? Read the next cell after you
# have written your answer.

# %% [markdown] tags=["solution"]
# **Worked answer.** The answer of `bucket_sort` is itself a sequence: answer slot $k$ must write the $k$-th
# smallest symbol, so it must know that it is slot $k$. Without positions all placeholders are identical tokens
# in identical surroundings, so NoPE writes the same output at every answer position. Positions are still
# needed on the output side.

# %% [markdown]
# The other side of the coin: without positions all placeholders are identical tokens in identical
# surroundings, so NoPE gives the **same** output at every answer position. It cannot write a reversed
# string, and, a subtlety of the ††† label, it cannot write a sorted one either: `bucket_sort`'s answer
# does not depend on the order of the input, but the answer is itself a sequence, and answer slot $k$ must
# know that it is slot $k$. Positions are still needed on the output side.

# %%
# NBVAL_CHECK_OUTPUT
task = md.tasks.get_task("bucket_sort")
inputs, targets = task.sample(1, 12, torch.Generator().manual_seed(4))
torch.manual_seed(0)
nope = md.GPT(md.che.task_config(task, md.GPTConfig(pe="none", **SIZE))).to(DEVICE).eval()
with torch.no_grad():
    answer_logits = nope(md.tasks.encoder_inputs(inputs, task).to(DEVICE))[0][0, -12:]
print("target (sorted)            :", targets[0].tolist())
print("NoPE outputs all identical :", bool((answer_logits - answer_logits[0]).abs().max() < 1e-5))

# %% [markdown]
# ## 4. Training: ALiBi, Kerple, DAPE-Kerple and DAPE1x3-Kerple
#
# `md.che.train_task(task, cfg, ...)` runs the whole protocol: it makes the config an encoder with the
# task's vocabulary (`task_config`), draws one length per step from $U\{1..40\}$, trains with Adam (warmup,
# cosine decay, gradient clipping at 1), then tests at every length in `test_lengths` on fresh, seeded
# samples. It returns the model, the training history and a results dict with the accuracy per length and
# the mean over lengths beyond training (the number the papers report).
#
# Four encoders, all on the same Kerple bias where a refiner is used:
#
# | model | attention scores $A$ |
# |---|---|
# | ALiBi | $QK^\top + B$, fixed slopes, $B_{ij} = -m_h\,\lvert i-j\rvert$ |
# | Kerple | $QK^\top + B$, $B_{ij} = -r_1 \ln(1 + r_2 \lvert i-j\rvert)$, learned $r_1, r_2$ per head |
# | DAPE-Kerple | $QK^\top + B + f(QK^\top, B)$, $f$ an MLP across heads (DAPE eq. 3) |
# | DAPE1x3-Kerple | $QK^\top + B + \mathrm{Conv}([QK^\top, B])$, $1\times3$ convolutions along keys (DAPE-V2) |
#
# In an encoder the bias depends on $\lvert i - j\rvert$ (attention looks both ways). DAPE-V2's `tril` is a
# causal device and is not needed here: the encoder may read every key, so the convolution sees whole rows.
#
# Two tasks that this small budget can learn within the training lengths, so that the question
# "what happens beyond?" is meaningful: `reverse_string` (DCF) and `bucket_sort` (CS, †††). Both need $n$
# answer tokens, so the test sequences reach 400 tokens. (`even_pairs` and `missing_duplicate_string`, the
# other tasks where DAPE shines in the papers, stayed at chance for every model here even after 2000 steps
# with 2 or 3 layers: section 6 shows them at a larger budget.)

# %%
MODELS = {
    "ALiBi": dict(pe="alibi"),
    "Kerple": dict(pe="kerple_log"),
    "DAPE-Kerple": dict(pe="kerple_log", refiner="dape"),
    "DAPE1x3-Kerple": dict(pe="kerple_log", refiner="conv"),
}
TASKS = ["reverse_string", "bucket_sort"]

results, histories = {}, {}
for name in TASKS:
    for label, overrides in MODELS.items():
        _, histories[name, label], results[name, label] = md.che.train_task(
            name, md.GPTConfig(**SIZE, **overrides), steps=STEPS, batch_size=BATCH, lr=1e-3,
            max_train_length=MAX_TRAIN_LENGTH, test_lengths=TEST_LENGTHS, eval_samples=EVAL_SAMPLES,
            seed=0, progress=False, device=DEVICE)
        r = results[name, label]
        print(f"{name:<15} {label:<12} accuracy within training {r['mean_within_train']:6.1%}, beyond "
              f"{r['mean_beyond_train']:6.1%}   ({r['parameters']:,} parameters, train {r['train_seconds']:.0f} s, "
              f"test {r['eval_seconds']:.0f} s)")

# %% [markdown]
# The training loss (one point per logged step, smoothed over 10 points; each step has its own length, so
# the raw curve is noisy):

# %%
fig, axes = plt.subplots(1, len(TASKS), figsize=(12, 3.8))
for ax, name in zip(axes, TASKS):
    for label in MODELS:
        history = histories[name, label]
        losses = torch.tensor([entry["loss"] for entry in history])
        window = min(10, len(losses))
        smooth = losses.unfold(0, window, 1).mean(dim=1)
        ax.plot([entry["step"] for entry in history][window - 1:], smooth, label=label, **md.plots.model_style(label))
    ax.set_title(f"{name}: training loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy on answer tokens")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5. Accuracy against input length
#
# Left of the dashed line: lengths seen in training. Right of it: extrapolation. The dotted line is chance
# (50% for the bits of `reverse_string`, 20% for the digits 0–4 of `bucket_sort`).

# %%
accuracy = {name: {label: results[name, label]["accuracy"] for label in MODELS} for name in TASKS}
beyond = {name: {label: results[name, label]["mean_beyond_train"] for label in MODELS} for name in TASKS}
within = {name: {label: results[name, label]["mean_within_train"] for label in MODELS} for name in TASKS}
# Quick mode (30 steps) cannot show the effects below: the teacher's full-mode run is drawn under it.
reference_run = notebook.reference("07/accuracy", {"accuracy": accuracy, "beyond": beyond, "within": within})
rows = [(f"your run, {STEPS} steps", accuracy)]
if QUICK and reference_run is not None:
    rows.append(("teacher's reference: the full-mode run, 1000 steps", reference_run["accuracy"]))
fig, axes = plt.subplots(len(rows), len(TASKS), figsize=(12, 4.2 * len(rows)), squeeze=False)
for row, (who, curves) in zip(axes, rows):
    for ax, name in zip(row, TASKS):
        task = md.tasks.get_task(name)
        md.plots.plot_accuracy(curves[name], train_length=MAX_TRAIN_LENGTH, chance=task.chance_accuracy, ax=ax,
                               title=f"{who}\n{name} ({task.level})")
plt.tight_layout()
plt.show()

for name in TASKS:
    table = md.che.accuracy_table({label: results[name, label] for label in MODELS}, MAX_TRAIN_LENGTH)
    display(Markdown(f"**{name}**: accuracy (%) by input length\n\n{table}"))


def print_ranking(beyond, who):
    for name in TASKS:
        ranking = sorted(beyond[name], key=beyond[name].get, reverse=True)
        print(f"{who}, {name}: beyond training, best to worst: " + " > ".join(ranking))


print_ranking(beyond, "your run")
shown = None if QUICK else {"beyond": beyond, "within": within}    # the run the text below describes
if QUICK and reference_run is not None:
    shown = reference_run
    print_ranking(shown["beyond"], "teacher's reference")
if shown is not None:   # the claims of the text below, checked on the run it describes
    others = max(v for label, v in shown["beyond"]["bucket_sort"].items() if label != "DAPE1x3-Kerple")
    assert shown["beyond"]["bucket_sort"]["DAPE1x3-Kerple"] > others + 0.15, shown["beyond"]["bucket_sort"]
    assert all(shown["within"][name][label] > md.tasks.get_task(name).chance_accuracy + 0.15
               for name in TASKS for label in MODELS), shown["within"]

# %% [markdown]
# **What to look for.**
#
# (The tables and the ranking printed under them are this run's numbers; the text describes the full-mode run,
# in quick mode the teacher's reference drawn under yours, and the cell asserts the two claims marked *checked*
# on that run.)
#
# - *Within the training lengths* all four models fit both tasks above chance (*checked*: by more than 15
#   points), some much better than others: compare the "train" columns to see which fits best, and the loss
#   curves above to see which trains fastest.
# - *Beyond training* every curve falls. On `reverse_string` read the printed ranking: does it follow the fit
#   inside the training lengths? Reversal is hard for any relative encoding: answer slot $k$ must read the input
#   symbol at distance $2k+1$ from itself, and distances beyond 79 never occur in training.
# - `bucket_sort` shows the largest gap: DAPE1x3-Kerple stays far above the other three beyond training
#   (*checked*: by more than 15 points), which fall towards chance. Each answer slot has to weigh the whole input
#   (how many symbols are smaller than each digit), and a fixed bias that decays with distance gets in the way
#   as inputs grow; a refiner can reshape the scores of each query row. Whether DAPE-Kerple gains over Kerple at
#   this budget, the ranking says; in the larger run of section 6 it does.
#
# All numbers here come from one seed and a tiny budget: a difference of a few points between two models is
# noise; differences of tens of points, as on `bucket_sort`, are not.
#
# ## 6. A larger run: all 15 tasks from the command line
#
# The same protocol runs from the shell, one task and one model per call; it prints the table and writes
# `results.md`, `results.json` (with the accuracy at every length and the training history) and
# `accuracy.png`:
#
# ```
# python -m minidape che --task even_pairs --pe kerple_log --refiner conv \
#     --n-layer 3 --n-embd 128 --n-head 8 --steps 2000 --batch-size 64 --max-test-length 500 --length-step 5
# ```
#
# We ran that for every task and the four models above on one H100 GPU (3 layers, 128 channels, 8 heads,
# about 0.6M parameters, 2000 steps of 64 sequences, lr $10^{-3}$, seed 0; test lengths 5, 10, …, 500 with 64
# sequences each; 40 s to 4.5 min per model, with 8 to 12 runs sharing the GPU). Mean accuracy (%) over the
# test lengths 45–500, with the mean over the training lengths 5–40 in brackets:
#
# | level | task | chance | ALiBi | Kerple | DAPE-Kerple | DAPE1x3-Kerple |
# |---|---|---:|---:|---:|---:|---:|
# | R | even_pairs | 50 | 49.3 (50) | 49.3 (50) | 49.2 (50) | **100.0** (100) |
# | R | modular_arithmetic | 20 | 20.0 (22) | 20.1 (24) | 20.1 (23) | 20.1 (23) |
# | R | parity_check ††† | 50 | 49.6 (49) | 49.9 (51) | 49.9 (45) | 50.2 (54) |
# | R | cycle_navigation ††† | 20 | 20.7 (18) | 20.3 (33) | 19.5 (38) | 20.1 (28) |
# | DCF | stack_manipulation | 50 | 49.7 (68) | 52.5 (79) | 51.5 (73) | 48.6 (78) |
# | DCF | reverse_string | 50 | 58.2 (95) | 59.2 (94) | 57.8 (97) | **63.2** (100) |
# | DCF | modular_arithmetic_brackets | 20 | 31.3 (33) | 31.4 (37) | 30.8 (30) | 30.6 (36) |
# | DCF | solve_equation | 20 | 20.8 (30) | 19.6 (33) | 19.7 (28) | 20.4 (31) |
# | CS | duplicate_string | 50 | 51.6 (61) | 52.8 (61) | 51.5 (65) | 52.4 (70) |
# | CS | missing_duplicate_string | 50 | 51.2 (53) | 50.2 (62) | 50.6 (54) | 50.8 (74) |
# | CS | odds_first | 50 | 52.5 (61) | 52.7 (61) | 51.9 (61) | 52.6 (69) |
# | CS | binary_addition | 50 | 49.5 (51) | 50.5 (54) | 49.5 (52) | 49.9 (62) |
# | CS | binary_multiplication | 50 | 49.8 (58) | 50.0 (54) | 49.2 (58) | 50.9 (68) |
# | CS | compute_sqrt | 50 | 50.1 (55) | 50.2 (55) | 50.4 (60) | 51.1 (65) |
# | CS | bucket_sort ††† | 20 | 30.6 (100) | 38.9 (100) | 74.1 (100) | **76.8** (100) |
#
# Reading it next to the papers' Tables 2 and 6 (200k steps, 5 layers × 256):
#
# - With 1% of the papers' training, most tasks stay near chance even *inside* the training lengths (the
#   bracketed numbers): those rows say nothing about extrapolation yet. The papers' numbers beyond training
#   are themselves close to chance for many tasks (parity 50%, compute_sqrt 51–52%, solve_equation 20–24%).
# - Where the models did learn the training lengths, the refiners help beyond them: `bucket_sort` (74–77%
#   against 31–39%) and `even_pairs`, which DAPE1x3-Kerple solves at every length up to 500 while the three
#   others never leave chance. The DAPE-V2 paper reports 100% for DAPE1x3-Kerple on `even_pairs` as well, and
#   57.5% for Kerple. On `bucket_sort` the papers' far longer training brings every encoding to about 99%:
#   our gap there measures how quickly each one learns a rule that extrapolates, not a limit.
# - DAPE1x3-Kerple fits the training lengths best on almost every task (its bracketed numbers), in line with
#   DAPE-V2's claim that the convolution over neighbouring scores helps algorithmic tasks.
#
# ## 7. Try it yourself
#
# - Randomized positional encodings (Ruoss et al.): `md.GPTConfig(pe="rope", random_positions=2048)` trains
#   on sorted random positions from $[0, 2048)$ and `train_task` draws them at test time too, so lengths up
#   to 500 are never "new" positions (`--random-positions 2048` on the command line).
# - More steps help every model: rerun section 4 with `STEPS = 3000` (three times as long) and watch which
#   curves move beyond the dashed line.
# - `even_pairs` needs only the first and the last input symbol. Why can an encoder whose bias depends on
#   $\lvert i-j\rvert$ alone not tell the first symbol from the last without help, and what could a
#   convolution over neighbouring scores add?

# %%
exercises.summary("07")
print(f"notebook run time: {RUN.seconds():.0f} s")
