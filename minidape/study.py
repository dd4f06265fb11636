r"""The papers' claims tested with seeds and statistics (`reproduce`), and any bias put through the same
protocol (`compare`).

```python
import minidape as md
from minidape.study import compare, reproduce
reproduce(budget="small", out="runs/reproduce-small")          # claims C1-C6 -> REPRODUCTION.md, figures
compare("my_bias", against=("alibi", "kerple_log"), seeds=3)   # a registered bias against the baselines
compare("my_bias.py:MyBias", out="runs/compare/my_bias")       # or a class in a file, registered on the fly
```

The protocol. Every model of a comparison is trained with the same budget once per seed (seed ``s`` fixes
the initialisation and the batches, so seed ``s`` of two models saw the same data), then evaluated at the
training length ``T`` times 1, 2, 4, 8, 16 with both protocols of `md.evaluate.perplexity_by_length`, which
score the same tokens at every length (``last_k``: fixed disjoint stretches placed over the whole validation
split, each length reading the window that ends at them; ``nonoverlap``: one stretch cut into windows), for
every model and seed. Each statement of a claim is judged by one endpoint per unit (a corpus and seed): its
mean over the units with a 95 % confidence interval, a t-test and an exact sign-flip permutation test
(`scipy.stats`), Holm's adjustment across the report's statements; the verdict rule is `VERDICT_RULE`.

Runs are resumable: each (corpus, training length, model, seed) run writes one JSON file, atomically, under
``OUT/runs/``; a restart skips the files already there, and a restart with other settings into the same
``OUT`` is refused (``OUT/manifest.json`` records them), so results of two budgets never mix. The same
command started twice (two terminals) shares the runs between the two processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import FormatStrFormatter, NullFormatter

from .data import load_corpus
from .evaluate import PROTOCOLS, perplexity_by_length
from .model import (GPT, PE_NAMES, PE_REGISTRY, REFINER_NAMES, AdditiveBias, ConvRefiner, GPTConfig,
                    check_causal, register_pe, register_refiner)
from .plots import model_style, save_figure
from .train import check_no_leak, train
from .utils import (RESULT_FILES, atomic_path, file_lock, holds_out_folder, json_ready, refuse_to_replace,
                    resolve_device, user_path)

ALPHA = 0.05
LEARNED_MARGIN = 0.1      # a CHE task counts as learned 10 points above chance within 1..40
VERDICT_RULE = (
    "Each statement is judged by one endpoint per unit — a corpus and seed for perplexity (units pooled over "
    "corpora), a seed for C6 — defined with the statement: for a comparison of two models, their log ratio of "
    "perplexity per byte averaged over both protocols and the statement's evaluation lengths; for "
    "\"degrades\" and \"stays within\" statements, the log ratio of a model's perplexity per byte at 16x the "
    "training length to that at 1x (both protocols); for C6, the accuracy difference in points averaged over the "
    "test lengths beyond training. The estimate is the mean over the units with its 95 % t confidence interval, "
    "shown as a ratio minus 1 (or in points). The test (`scipy.stats.ttest_1samp`) is two-sided against 0 for "
    "directional statements; for \"stays within\" / \"near-equal\" statements it is an equivalence test (TOST, "
    "the larger of two one-sided p) against the stated margin when the estimate lies inside it, and the one-sided "
    "test that the mean lies beyond the margin when the estimate lies outside. Beside it, an exact sign-flip "
    "permutation test of the same hypothesis (`scipy.stats.permutation_test`, all 2^n sign flips), a check that "
    f"does not assume normally distributed units. The t-test p-values of all the report's statements are "
    f"adjusted together by Holm's method. A statement is **reproduced** when its Holm-adjusted p < {ALPHA} and "
    "the estimate lies on the claimed side (inside the margin); **not reproduced** when its Holm-adjusted p < "
    f"{ALPHA} and the estimate lies on the other side (beyond the margin): the data favour the opposite; "
    "**inconclusive at this budget** otherwise. The sign-flip p does not enter the verdict: with 5 units it "
    "cannot go below 2/2^5 = 0.0625 (two-sided). A claim is reproduced when all its statements are, not "
    "reproduced when all are not, partly reproduced when some are, inconclusive otherwise (statements not tested "
    f"left out). A C6 statement is **not tested** when no model is {100 * LEARNED_MARGIN:.0f} points above "
    "chance within the training "
    "lengths on its task (two models at chance are near-equal trivially); it then leaves Holm's family. The "
    "per-cell numbers "
    "under each statement (signed difference and an unadjusted paired t-test per corpus, protocol and length) "
    "describe where an effect comes from; they do not vote.")


# ----------------------------------------------------------------------------- the leaky refiner of C4


class ConvRefinerWithoutTril(ConvRefiner):
    """BROKEN ON PURPOSE (claim C4 only): DAPE-V2's conv refiner without ``tril``, the paper's "cheating"
    run (§4.5, Figure 6). The masked (future) scores are NOT zeroed before the convolutions, so the score
    $q_i \\cdot k_{i+1}$, computed from the very token position $i$ must predict, is moved onto the diagonal
    cell by the 1 x k kernel. Never use it for a real model."""

    row_local = True    # 1 x k convolutions along the keys: each row alone, so the fast path's blocks run it

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        # Two stacked 1 x k convolutions read k//2 keys each past the diagonal: the blocked attention must hand
        # this refiner that many future keys, or the leak it is meant to show would be cut off at block edges.
        self.key_margin = 2 * (cfg.refiner_kernel // 2)

    def forward(self, scores, bias, mask):
        return super().forward(scores, bias, torch.ones_like(mask))    # every cell "allowed": no tril


LEAKY_REFINER = "conv_no_tril"


def register_leaky_refiner() -> None:
    """Register C4's broken refiner, only when the study runs (it is no choice for ordinary models)."""
    if LEAKY_REFINER not in REFINER_NAMES:
        register_refiner(LEAKY_REFINER)(ConvRefinerWithoutTril)


# ----------------------------------------------------------------------------- budgets


@dataclasses.dataclass(frozen=True)
class Budget:
    """Model size, training and evaluation of every run of a study."""

    n_layer: int
    n_embd: int
    n_head: int
    steps: int                      # AdamW steps per language model (cosine schedule, 5% warmup)
    batch_size: int
    lr: float
    train_lengths: tuple[int, ...]  # the first is the main one; any others train C1's models on the first corpus
    eval_factors: tuple[int, ...]   # evaluation lengths = training length x these
    last_k: int                     # last_k scores min(last_k, training length) tokens per window
    eval_windows: int               # scored stretches (windows per length) of the last_k protocol
    nonoverlap_tokens: int          # predictions scored at every length by the nonoverlap protocol
    che_steps: int                  # Adam steps per Chomsky-hierarchy encoder
    che_batch_size: int
    che_lr: float
    che_test_lengths: tuple[int, ...]   # a few lengths within 1..40 (did the model learn the task?), then
                                        # lengths spread evenly over 41..500 (the papers test every length)
    che_eval_samples: int
    che_random_positions: int       # randomized positions: sorted draws from [0, L), L as in the DAPE paper


def _spread(first: int, last: int, count: int) -> tuple[int, ...]:
    """`count` lengths evenly spread over first..last, both included (the papers average over every length)."""
    return tuple(round(first + i * (last - first) / (count - 1)) for i in range(count))


# CPU budgets. "default" (205 runs): 1 h 34 min as two processes sharing the folder on the project's 2-core AMD
# EPYC while other jobs loaded it (load 4-19; the runs' own time 3 h 07 min, a Kerple-log run 30-80 s there
# against about 10 s at load below 1). "small" (the same runs, half the steps, a third of the evaluation): not
# timed with these settings. "tiny" is for the tests only (every code path, no meaning).
BUDGETS = {
    "tiny": Budget(n_layer=1, n_embd=16, n_head=2, steps=2, batch_size=2, lr=3e-3, train_lengths=(16, 8),
                   eval_factors=(1, 2), last_k=8, eval_windows=2, nonoverlap_tokens=64, che_steps=2,
                   che_batch_size=2, che_lr=1e-3, che_test_lengths=(20, 41, 44), che_eval_samples=2,
                   che_random_positions=128),
    "small": Budget(n_layer=2, n_embd=64, n_head=4, steps=150, batch_size=8, lr=3e-3, train_lengths=(128,),
                    eval_factors=(1, 2, 4, 8, 16), last_k=256, eval_windows=8, nonoverlap_tokens=4096,
                    che_steps=500, che_batch_size=32, che_lr=1e-3, che_test_lengths=(20, 40) + _spread(41, 500, 6),
                    che_eval_samples=16, che_random_positions=2048),
    "default": Budget(n_layer=2, n_embd=64, n_head=4, steps=300, batch_size=8, lr=3e-3, train_lengths=(128,),
                      eval_factors=(1, 2, 4, 8, 16), last_k=256, eval_windows=24, nonoverlap_tokens=8192,
                      che_steps=1000, che_batch_size=32, che_lr=1e-3,
                      che_test_lengths=(20, 40) + _spread(41, 500, 12),
                      che_eval_samples=32, che_random_positions=2048),
}
# On CUDA the same budget names pick a larger model, longer training and evaluation to 64x by themselves.
# (Not measured: this session had no GPU.)
CUDA_OVERRIDES = {
    "small": dict(n_layer=4, n_embd=256, n_head=8, steps=1000, batch_size=32, lr=1e-3, eval_windows=32,
                  nonoverlap_tokens=32768, che_steps=1000, che_eval_samples=64),
    "default": dict(n_layer=4, n_embd=256, n_head=8, steps=3000, batch_size=32, lr=1e-3,
                    eval_factors=(1, 2, 4, 8, 16, 32, 64), eval_windows=32, nonoverlap_tokens=65536,
                    che_steps=5000, che_batch_size=64, che_eval_samples=128,
                    che_test_lengths=(20, 40) + _spread(41, 500, 24)),
}
BUDGET_NAMES = ("small", "default")   # the public ones; "tiny" is for tests
CHE_MAX_TRAIN_LENGTH = 40             # the papers': train on 1..40, test on 41..500
DEFAULT_CORPORA = ("austen", "python", "latex")
DEFAULT_SEEDS = 5


def resolve_budget(name: str, device: torch.device) -> Budget:
    if name not in BUDGETS:
        raise ValueError(f"unknown budget {name!r}; valid budgets: {', '.join(BUDGET_NAMES)}")
    budget = BUDGETS[name]
    if device.type == "cuda" and name in CUDA_OVERRIDES:
        budget = dataclasses.replace(budget, **CUDA_OVERRIDES[name])
    return budget


# ----------------------------------------------------------------------------- the study: models and claims

MATCHED_WIDTH = "matched to the 1x3 conv"   # refiner_width placeholder: resolved by `_lm_config`

# label -> GPTConfig overrides. "DAPE1x1" is DAPE itself: a 1 x 1 convolution over the head channels is the
# per-cell MLP of DAPE, which is why DAPE-V2's Table 4 labels DAPE-Kerple "kernel size 1x1".
MODELS = {
    "NoPE": {"pe": "none"},
    "RoPE": {"pe": "rope"},
    "sinusoidal APE": {"pe": "sinusoidal"},
    "ALiBi": {"pe": "alibi"},
    "Kerple-log": {"pe": "kerple_log"},
    "Kerple-power": {"pe": "kerple_power"},
    "FIRE": {"pe": "fire"},
    "DAPE-ALiBi": {"pe": "alibi", "refiner": "dape"},
    "DAPE-Kerple": {"pe": "kerple_log", "refiner": "dape"},
    "DAPE-Kerple-power": {"pe": "kerple_power", "refiner": "dape"},
    "DAPE-FIRE": {"pe": "fire", "refiner": "dape"},
    "DAPE-Kerple Concat": {"pe": "kerple_log", "refiner": "dape_concat"},
    "DAPE-Kerple Add_Residual": {"pe": "kerple_log", "refiner": "dape_add"},
    "DAPE1x3-Kerple": {"pe": "kerple_log", "refiner": "conv", "refiner_kernel": 3},
    "DAPE1x5-Kerple": {"pe": "kerple_log", "refiner": "conv", "refiner_kernel": 5},
    "DAPE-Kerple, 1x3's parameters": {"pe": "kerple_log", "refiner": "dape", "refiner_width": MATCHED_WIDTH},
    "DAPE1x3-Kerple without tril": {"pe": "kerple_log", "refiner": LEAKY_REFINER, "refiner_kernel": 3},
}
CHE_MODELS = {"Kerple-log": {"pe": "kerple_log"}, "DAPE-Kerple": {"pe": "kerple_log", "refiner": "dape"}}
CHE_TASKS = ("missing_duplicate_string", "even_pairs", "reverse_string", "bucket_sort")

# Where a statement is tested: "everywhere" = every corpus at the main training length and the first corpus at
# the budget's other training lengths (none in the CPU budgets); "main" = every corpus at the main length;
# "first" = the first corpus, main length.
SCOPES = ("everywhere", "main", "first")
# What a statement claims about its endpoint (see `Statement`): the claimed side of zero, or within a margin.
KINDS = {"lower": "below", "degrades": "above", "flat": "within", "higher": "above", "near": "within"}
FLAT_MARGIN = 0.10        # "stays near its perplexity per byte at the training length": within ±10 % (as a ratio)
NEAR_MARGIN = 5.0         # C6 "near-equal": accuracies within ±5 points
NOT_TESTED = "not tested: no model learned the task"   # C6 verdict of a task no model learned within training
UNIGRAM_SHARE = 0.9       # a model above 90 % of the byte-frequency perplexity learned (almost) no context


@dataclasses.dataclass(frozen=True)
class Statement:
    """One claim, tested by one endpoint per unit (a corpus and seed; a seed for C6):

    - ``lower``: ``model``'s perplexity per byte is below ``factor`` x ``other``'s. Endpoint: the mean over
      both protocols and the statement's lengths of ``log ppl(model) - log ppl(other)``, minus ``log factor``;
      claimed below 0.
    - ``degrades``: ``model`` is worse at 16 x its training length than at it. Endpoint: ``log ppl(16 T) - log
      ppl(T)`` (mean over both protocols): the gap at 16 x against 1 x, claimed above 0.
    - ``flat``: the same endpoint, claimed within ``±log(1 + FLAT_MARGIN)`` (an equivalence test).
    - ``higher`` / ``near`` (C6, ``task``): accuracy of ``model`` minus ``other``'s, in points, averaged over
      the test lengths beyond training: claimed above 0 / within ``±NEAR_MARGIN``.
    """

    text: str
    kind: str
    model: str
    other: str | None = None
    factor: float = 1.0
    lengths: str = "all"            # "all" evaluation lengths, or only those "beyond" the training length
    scope: str = "main"
    task: str | None = None         # C6: the Chomsky-hierarchy task

    @property
    def margin(self) -> float:
        """Half-width of the equivalence band of a ``flat`` / ``near`` statement (log ratio / points)."""
        return math.log1p(FLAT_MARGIN) if self.kind == "flat" else NEAR_MARGIN


@dataclasses.dataclass(frozen=True)
class Claim:
    key: str
    title: str
    source: str
    paper: str                      # the paper's own numbers, quoted
    models: tuple[str, ...]         # shown in the claim's tables and figure
    statements: tuple[Statement, ...]
    che: bool = False               # C6: Chomsky-hierarchy accuracy instead of perplexity


def _degrades(model: str) -> Statement:
    return Statement(f"{model} is worse at 16x the training length than at it", "degrades", model,
                     scope="everywhere")


def _stays_near(model: str) -> Statement:
    return Statement(f"{model} at 16x the training length stays within ±{FLAT_MARGIN:.0%} of its perplexity per "
                     f"byte at the training length", "flat", model, scope="everywhere")


def _lower(model: str, other: str, scope: str = "main", **options) -> Statement:
    return Statement(f"{model} has a lower perplexity per byte than {other}", "lower", model, other, scope=scope,
                     **options)


def _che(task: str, kind: str) -> Statement:
    text = (f"{task}: DAPE-Kerple has a higher accuracy beyond the training lengths than Kerple-log" if kind == "higher"
            else f"{task}: DAPE-Kerple and Kerple-log are within ±{NEAR_MARGIN:.0f} points beyond the training "
                 "lengths")
    return Statement(text, kind, "DAPE-Kerple", "Kerple-log", task=task)


CLAIMS = (
    Claim("C1", "NoPE, RoPE and sinusoidal APE degrade past the training length; ALiBi and Kerple stay near their "
                "in-length perplexity up to 16x (learned APE cannot run there)",
          "KERPLE Table 3; DAPE Table 5 (appendix E); DAPE-V2 Table 2 (appendix B)",
          "KERPLE Table 3 (train 512, 5 seeds, non-overlapping windows), OpenWebText2, perplexity per token: "
          "Rotary 24.2 → 32.8 (1024) → 269 (16384); Sinusoidal 33 → 30046 (16384); ALiBi 23.9 → 22.5 (16384); "
          "Kerple-log 23.9 → 21.4 (16384). DAPE Table 5 (arXiv, train 512, 3 seeds, last 256 tokens): RoPE "
          "4.58 → 45.2 (1024) → 265 (8192); ALiBi 4.61 → 4.77; Kerple 4.58 → 13.35 (8192: Kerple degrades "
          "slowly in this protocol). DAPE-V2 Table 2 (arXiv, train 1024): NoPE 4.16 → 42.27 (2048) → 17167 "
          "(8192). Learned absolute positions have no embedding past the training length: such a model cannot "
          "run there at all, so it is reported apart (below), not tested.",
          ("NoPE", "RoPE", "sinusoidal APE", "ALiBi", "Kerple-log"),
          (_degrades("NoPE"), _degrades("RoPE"), _degrades("sinusoidal APE"), _stays_near("ALiBi"),
           _stays_near("Kerple-log"))),
    Claim("C2", "DAPE-X beats X for X in ALiBi, Kerple, FIRE, at and beyond the training length; the three DAPE "
                "variants against each other",
          "DAPE Table 5 (appendix E) and Figure 5",
          "DAPE Table 5 (arXiv, train 512, 3 seeds, perplexity per token at 512 / 2048 / 8192): ALiBi 4.61 / "
          "4.87 / 4.77 vs DAPE-ALiBi 4.53 / 4.11 / 4.00; Kerple 4.58 / 5.44 / 13.35 vs DAPE-Kerple 4.51 / 4.05 / "
          "3.86; FIRE 4.57 / 30.12 / 308.6 vs DAPE-FIRE 4.49 / 4.28 / 6.16; \"all with p-values less than "
          "0.05\". Figure 5 (DAPE-Kerple, train 128, at 8192): Concat_Residual 5.00, Concat 5.03, Add_Residual "
          "5.17; \"all variants of DAPE surpass the baseline performance of Kerple\" and the concatenating ones "
          "beat Add_Residual. The papers' Kerple is the log variant; since Kerple-power beats Kerple-log at "
          "this budget (C5), DAPE on Kerple-power is tested beside it as a control.",
          ("ALiBi", "DAPE-ALiBi", "Kerple-log", "DAPE-Kerple", "Kerple-power", "DAPE-Kerple-power", "FIRE",
           "DAPE-FIRE", "DAPE-Kerple Concat", "DAPE-Kerple Add_Residual"),
          (_lower("DAPE-Kerple", "Kerple-log"), _lower("DAPE-Kerple-power", "Kerple-power"),
           _lower("DAPE-ALiBi", "ALiBi", "first"), _lower("DAPE-FIRE", "FIRE", "first"),
           _lower("DAPE-Kerple Concat", "Kerple-log", "first"),
           _lower("DAPE-Kerple Add_Residual", "Kerple-log", "first"),
           _lower("DAPE-Kerple", "DAPE-Kerple Add_Residual", "first"),
           _lower("DAPE-Kerple Concat", "DAPE-Kerple Add_Residual", "first"))),
    Claim("C3", "The 1x3 conv refiner (DAPE-V2) beats DAPE (1x1), also at a matched parameter count; kernel "
                "sizes 1, 3, 5",
          "DAPE-V2 Table 4 (appendix F) and §4.6",
          "DAPE-V2 Table 4 (train 128; perplexity per token at 128 / 1024 / 8192), arXiv: Kerple 8.30 / 6.91 / "
          "12.59, DAPE-Kerple (1x1) 8.21 / 5.20 / 4.97, 1x3 8.15 / 5.05 / 4.60, 1x5 8.13 / 5.04 / 4.57; Books3: "
          "Kerple 32.10 / 35.75 / 66.23, 1x1 31.49 / 24.31 / 25.01, 1x3 31.07 / 23.57 / 23.52, 1x5 31.02 / "
          "23.57 / 23.71. \"The optimal kernel size may not always be the largest one\" (1x5 vs 1x3 is not "
          "claimed). §4.6: DAPE1x3-Kerple with hidden width 10 (8.16 at 128, 4.74 at 8192) beats DAPE-Kerple "
          "with width 64 (8.21, 4.87) \"at a lower computational cost\". Our control: a DAPE-Kerple whose MLP is "
          "widened to the 1x3 refiner's parameter count.",
          ("Kerple-log", "DAPE-Kerple", "DAPE-Kerple, 1x3's parameters", "DAPE1x3-Kerple", "DAPE1x5-Kerple"),
          (_lower("DAPE1x3-Kerple", "DAPE-Kerple", "first"), _lower("DAPE1x5-Kerple", "DAPE-Kerple", "first"),
           _lower("DAPE1x3-Kerple", "DAPE-Kerple, 1x3's parameters", "first"))),
    Claim("C4", "Without tril the conv refiner reads the future and its perplexity collapses toward 1; with tril "
                "it does not",
          "DAPE-V2 §4.5 and Figure 6",
          "DAPE-V2 §4.5: \"their cheating version can all achieve about zero loss within evaluation length 1024\", "
          "\"the DAPE_{1×3}-Kerple can even achieve zero loss when the evaluation length is extended to 8096\" "
          "(perplexity about 1; the tril version trains normally).",
          ("Kerple-log", "DAPE1x3-Kerple", "DAPE1x3-Kerple without tril"),
          (Statement("DAPE1x3-Kerple without tril has less than half the perplexity per byte of DAPE1x3-Kerple",
                     "lower", "DAPE1x3-Kerple without tril", "DAPE1x3-Kerple", factor=0.5, scope="first"),)),
    Claim("C5", "Kerple-log against Kerple-power",
          "KERPLE Table 3",
          "KERPLE Table 3 (train 512, 5 seeds, log / power at 2048 and 16384, perplexity per token): "
          "OpenWebText2 21.6 / 21.9* and 21.4 / 21.6; GitHub 2.86 / 2.90* and 2.75 / 2.76; arXiv 5.22 / 5.26* "
          "and 5.07 / 5.07 (* = the log variant significantly better, paired two-sided t-test, α = 0.05). The "
          "log variant is better or equal everywhere, significantly at about half the lengths.",
          ("Kerple-log", "Kerple-power"),
          (_lower("Kerple-log", "Kerple-power", lengths="beyond"),)),
    Claim("C6", "DAPE-Kerple against Kerple on Chomsky-hierarchy tasks, with the paper's signs (train lengths "
                "1-40, test 41-500)",
          "DAPE Table 2 (randomized positions, 200k steps)",
          "DAPE Table 2 (accuracy %, Kerple → DAPE-Kerple, averaged over test lengths 41–500): "
          "missing_duplicate 79.06 → 87.57 and even_pairs 57.50 → 99.58 (gains); reverse_string 71.54 → 70.74 "
          "and bucket_sort 99.38 → 98.81 (near-equal, DAPE slightly *worse*; bucket_sort is permutation-"
          "invariant).",
          tuple(CHE_MODELS),
          (_che("missing_duplicate_string", "higher"), _che("even_pairs", "higher"),
           _che("reverse_string", "near"), _che("bucket_sort", "near")),
          che=True),
)


# ----------------------------------------------------------------------------- statistics

def _sign_flip_p(values, alternative: str) -> float:
    """Exact sign-flip permutation test of "the values are symmetric about 0" (all 2^n flips)."""
    import numpy as np
    from scipy.stats import permutation_test
    return float(permutation_test((np.asarray(values, dtype=float),), lambda x, axis: np.mean(x, axis=axis),
                                  permutation_type="samples", vectorized=True, n_resamples=np.inf,
                                  alternative=alternative).pvalue)


@dataclasses.dataclass
class Endpoint:
    """One statement's endpoint over its units, and the test of what the statement claims.

    ``estimate`` and the 95 % confidence interval (``low``, ``high``) are those of the mean (Student's t over
    the units). ``p`` is the t-test of the conclusion the estimate points to, ``p_sign_flip`` the exact
    sign-flip permutation test of the same hypothesis; ``supports`` says whether that conclusion is the claim.
    - side ``below``/``above``: two-sided ``H0: mean = 0``; it supports the claim when the mean lies on the
      claimed side.
    - side ``within`` (an equivalence band ``±margin``): with the mean inside the band, TOST (two one-sided
      tests, ``p`` the larger), which supports the claim; with the mean outside, the one-sided test that the
      mean lies beyond that edge, which goes against it.
    """

    values: list[float]
    side: str
    margin: float = 0.0
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p: float = math.nan
    p_sign_flip: float = math.nan
    supports: bool = False

    def __post_init__(self):
        import numpy as np
        from scipy.stats import ttest_1samp
        data = np.asarray(self.values, dtype=float)
        if len(data) < 2 or np.isnan(data).any():          # too few units, or a model that cannot run
            return
        self.estimate = float(data.mean())
        with warnings.catch_warnings():                      # identical values: no spread, p and CI are NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            interval = ttest_1samp(data, 0.0).confidence_interval(1 - ALPHA)
            self.low, self.high = float(interval.low), float(interval.high)
            if self.side != "within":
                self.p = float(ttest_1samp(data, 0.0).pvalue)
                self.p_sign_flip = _sign_flip_p(data, "two-sided")
                self.supports = self.estimate < 0 if self.side == "below" else self.estimate > 0
            elif abs(self.estimate) < self.margin:
                self.p = max(float(ttest_1samp(data, -self.margin, alternative="greater").pvalue),
                             float(ttest_1samp(data, self.margin, alternative="less").pvalue))
                self.p_sign_flip = max(_sign_flip_p(data + self.margin, "greater"),
                                       _sign_flip_p(data - self.margin, "less"))
                self.supports = True
            else:
                edge, alternative = (self.margin, "greater") if self.estimate > 0 else (-self.margin, "less")
                self.p = float(ttest_1samp(data, edge, alternative=alternative).pvalue)
                self.p_sign_flip = _sign_flip_p(data - edge, alternative)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest of m p-values times (m - i + 1), kept monotone, at most 1.
    NaN (no test) stays NaN and does not count in m."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted, running = [math.nan] * len(p_values), 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[i] = running
    return adjusted


def verdict(endpoint: Endpoint, p_holm: float) -> str:
    """The statement's verdict by `VERDICT_RULE`."""
    if not p_holm < ALPHA:                                   # NaN counts as no evidence
        return "inconclusive at this budget"
    return "reproduced" if endpoint.supports else "not reproduced"


def claim_verdict(verdicts: list[str]) -> str:
    verdicts = [v for v in verdicts if v != NOT_TESTED] or [NOT_TESTED]
    if verdicts == [NOT_TESTED]:
        return "inconclusive at this budget"
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    if not any(v == "reproduced" for v in verdicts):
        return "not reproduced" if all(v == "not reproduced" for v in verdicts) else "inconclusive at this budget"
    return "partly reproduced"


@dataclasses.dataclass
class Cell:
    """One descriptive comparison shown in a claim's table (one corpus, protocol and length; one test length
    for C6): ``a`` against ``b``, paired by seed. For perplexities the signed difference is ``a / b - 1`` of the
    geometric means (%) and the paired t-test is on log perplexity; for accuracies it is in points."""

    where: str
    a: list[float]
    b: list[float]
    log: bool = True

    def difference(self) -> float:
        if self.log:
            return 100 * math.expm1(sum(math.log(x) - math.log(y) for x, y in zip(self.a, self.b)) / len(self.a))
        return 100 * sum(x - y for x, y in zip(self.a, self.b)) / len(self.a)

    def p(self) -> float:
        import numpy as np
        from scipy.stats import ttest_rel
        a, b = np.asarray(self.a, dtype=float), np.asarray(self.b, dtype=float)
        if np.isnan(a).any() or np.isnan(b).any():
            return math.nan
        with warnings.catch_warnings():               # zero variance gives p = NaN: shown as n/a
            warnings.simplefilter("ignore", RuntimeWarning)
            return float(ttest_rel(np.log(a), np.log(b)).pvalue if self.log else ttest_rel(a, b).pvalue)

    def text(self) -> str:
        difference = self.difference()
        if math.isnan(difference):
            return "n/a"
        unit = " %" if self.log else " pt"
        return f"{difference:+.1f}{unit} ({_format_p(self.p())})"


def _format_p(p: float) -> str:
    if math.isnan(p):
        return "p=n/a"
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN when a value is NaN; std 0 for one value)."""
    data = torch.tensor(values, dtype=torch.float64)
    return float(data.mean()), float(data.std()) if len(values) > 1 else 0.0


def format_mean_std(values: list[float]) -> str:
    mean, std = mean_std(values)
    if math.isnan(mean):
        return "n/a"
    digits = 2 if mean < 100 else 0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


# ----------------------------------------------------------------------------- runs: one JSON file each


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def _write_json(path: Path, payload) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(json_ready(payload), indent=1) + "\n")


def _read_json(path: Path):
    return json.loads(path.read_text())


def _nan(value) -> float:
    return math.nan if value is None else float(value)


def check_settings(out: Path, settings: dict) -> None:
    """Record `settings` in ``out/manifest.json``, or refuse when the folder holds runs made with others."""
    manifest = out / "manifest.json"
    settings = json_ready(settings)
    if manifest.is_file():
        previous = _read_json(manifest)
        changed = sorted(key for key in set(previous) | set(settings) if previous.get(key) != settings.get(key))
        if changed:
            raise ValueError(f"{out} holds runs made with other settings ({', '.join(changed)} differ: "
                             f"{', '.join(f'{key}={previous.get(key)!r}' for key in changed)}); "
                             f"use another --out, or delete {out} to start again")
    else:
        _write_json(manifest, settings)


def _check_seeds(seeds) -> int:
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 2:
        raise ValueError(f"seeds must be an integer >= 2 (a paired t-test needs two seeds at least); got {seeds!r}")
    return seeds


def _check_corpus_fits(corpus: str, budget: Budget, train_lengths) -> None:
    """Fail before any training when a corpus is too short for the budget's training or evaluation."""
    train_tokens, val_tokens = load_corpus(corpus, "train"), load_corpus(corpus, "val")
    longest = max(train_lengths) * max(budget.eval_factors)
    if len(train_tokens) <= max(train_lengths) + 1:
        raise ValueError(f"corpus {corpus!r} has {len(train_tokens)} training tokens; the budget trains on "
                         f"windows of {max(train_lengths) + 1}: use a larger corpus or the tiny budget")
    scored = min(budget.last_k, min(train_lengths))
    needed = max(longest + budget.eval_windows * scored, budget.nonoverlap_tokens + 1, longest + 1)
    if len(val_tokens) < needed:
        raise ValueError(f"corpus {corpus!r} has {len(val_tokens)} validation tokens (its last 10%); the budget "
                         f"evaluates up to length {longest}, scores {budget.eval_windows} disjoint stretches of "
                         f"{scored} tokens after that much context and {budget.nonoverlap_tokens} tokens in one "
                         f"stretch, which needs {needed}: use a larger corpus or a smaller budget")


def train_and_evaluate(cfg: GPTConfig, corpus: str, budget: Budget, seed: int, device: torch.device,
                       steps: int | None = None, allow_leakage: bool = False) -> dict:
    """Train one language model and measure its perplexity at every evaluation length, both protocols.
    `allow_leakage`: C4's leaky refiner (checked before the study starts), or `compare(allow_leakage=True)`."""
    steps = steps or budget.steps
    started = time.perf_counter()
    with warnings.catch_warnings():    # the leak, when allowed, is named once in the report, not per run
        warnings.filterwarnings("ignore", message=".* reads the future")
        model, history = train(cfg, load_corpus(corpus, "train"), val_data=load_corpus(corpus, "val"), steps=steps,
                               batch_size=budget.batch_size, lr=budget.lr, device=device, seed=seed,
                               eval_every=steps, eval_windows=8, progress=False, allow_leakage=allow_leakage)
    train_seconds = time.perf_counter() - started
    lengths = [cfg.block_size * factor for factor in budget.eval_factors]
    val_tokens = load_corpus(corpus, "val")
    with warnings.catch_warnings():    # learned APE beyond its table: NaN, as the report says
        warnings.filterwarnings("ignore", message="length .* skipped")
        perplexity = {"last_k": perplexity_by_length(model, val_tokens, lengths, last_k=budget.last_k,
                                                     n_windows=budget.eval_windows, seed=0),
                      "nonoverlap": perplexity_by_length(model, val_tokens, lengths, protocol="nonoverlap",
                                                         n_tokens=budget.nonoverlap_tokens)}
    return {"config": dataclasses.asdict(cfg), "corpus": corpus, "seed": seed, "steps": steps,
            "final_loss": history[-1]["loss"], "val_loss": history[-1].get("val_loss"),
            "perplexity": perplexity, "train_seconds": round(train_seconds, 1),
            "eval_seconds": round(time.perf_counter() - started - train_seconds, 1)}


def che_train_and_evaluate(task: str, cfg: GPTConfig, budget: Budget, seed: int, device: torch.device) -> dict:
    """Train and test one Chomsky-hierarchy encoder. The ONE call into the package's CHE training: repoint it
    here when it moves (helper CLI: ``minidape/che.py`` through ``md.train``)."""
    from .che import train_task
    _, _, results = train_task(task, cfg, steps=budget.che_steps, batch_size=budget.che_batch_size,
                               lr=budget.che_lr, max_train_length=CHE_MAX_TRAIN_LENGTH,
                               test_lengths=budget.che_test_lengths, eval_samples=budget.che_eval_samples,
                               device=device, seed=seed, progress=False)
    return results


class Progress:
    """One line per run: what, how long, and an estimate of the time left from the runs timed so far."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        self.started, self.timed, self.timed_seconds = time.perf_counter(), 0, 0.0

    def report(self, what: str, seconds: float | None, detail: str = "") -> None:
        self.done += 1
        if seconds is not None:
            self.timed, self.timed_seconds = self.timed + 1, self.timed_seconds + seconds
        if not self.enabled:
            return
        left = (self.total - self.done) * self.timed_seconds / self.timed if self.timed else 0.0
        timing = "done before" if seconds is None else f"{seconds:.0f} s"
        elapsed = _clock(time.perf_counter() - self.started)
        print(f"[{self.done}/{self.total}] {what}: {timing}{detail}  (elapsed {elapsed}, about {_clock(left)} left)",
              flush=True)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


def matched_dape_width(n_head: int, conv_width: int = 32, kernel: int = 3) -> int:
    """The DAPE MLP width with (nearly) the parameters of a conv refiner of `conv_width` and `kernel`, both over
    the 2h channels [S, B]: conv W(2h k + 1) + h(W k + 1), MLP D(2h + 1) + h(D + 1)."""
    conv = conv_width * (2 * n_head * kernel + 1) + n_head * (conv_width * kernel + 1)
    return round((conv - n_head) / (3 * n_head + 1))


def _lm_config(budget: Budget, train_length: int, overrides: dict) -> GPTConfig:
    if overrides.get("refiner_width") == MATCHED_WIDTH:
        overrides = {**overrides, "refiner_width": matched_dape_width(budget.n_head)}
    return GPTConfig(n_layer=budget.n_layer, n_embd=budget.n_embd, n_head=budget.n_head, block_size=train_length,
                     **overrides)


def _che_config(budget: Budget, overrides: dict) -> GPTConfig:
    """The CHE encoder: the LM budget's size and randomized positions as the DAPE papers used them;
    `md.che.task_config` makes it an encoder with its own classifier layer (`tie_embeddings=False`)."""
    return GPTConfig(n_layer=budget.n_layer, n_embd=budget.n_embd, n_head=budget.n_head,
                     random_positions=budget.che_random_positions, **overrides)


def _perplexity_summary(result: dict) -> str:
    curve = result["perplexity"]["last_k"]
    return ", last_k ppl " + " ".join(f"{length}:{_nan(ppl):.2f}" for length, ppl in curve.items())


# ----------------------------------------------------------------------------- reproduce


def _scope_places(scope: str, corpora: list[str], train_lengths: tuple[int, ...]) -> list[tuple[str, int]]:
    main = [(corpus, train_lengths[0]) for corpus in corpora]
    if scope == "first":
        return main[:1]
    if scope == "everywhere":
        return main + [(corpora[0], length) for length in train_lengths[1:]]
    return main


def study_plan(corpora: list[str], budget: Budget) -> dict[tuple[str, int], list[str]]:
    """{(corpus, training length): model labels to train there}, from the statements' scopes."""
    plan: dict[tuple[str, int], list[str]] = {}
    for claim in CLAIMS:
        if claim.che:
            continue
        for statement in claim.statements:
            for place in _scope_places(statement.scope, corpora, budget.train_lengths):
                labels = plan.setdefault(place, [])
                labels.extend(label for label in (statement.model, statement.other) if label and label not in labels)
    return plan


def _corpus_key(corpus: str) -> str:
    return _slug(Path(corpus).stem) if corpus not in ("austen", "latex", "python") else corpus


def _lm_run_path(out: Path, corpus: str, train_length: int, label: str, seed: int) -> Path:
    return out / "runs" / f"{_corpus_key(corpus)}-T{train_length}" / _slug(label) / f"seed{seed}.json"


def _che_run_path(out: Path, task: str, label: str, seed: int) -> Path:
    return out / "runs" / "che" / task / _slug(label) / f"seed{seed}.json"


@holds_out_folder(shared=True)      # two `reproduce` into one folder share its runs; anything else is refused
def reproduce(budget: str = "default", seeds: int = DEFAULT_SEEDS, corpora=DEFAULT_CORPORA, out="runs/reproduce",
              device: str | torch.device = "auto", progress: bool = True, command: str | None = None) -> dict:
    """Train and evaluate the claim study (C1-C6) and write ``REPRODUCTION.md``, ``results.json`` and
    ``figures/`` into ``out``. Resumable: runs already in ``out/runs`` are skipped. Returns the results.
    Refused before any training: a folder holding another command's results, and a model that reads the future
    (but C4's, which does so on purpose: the report's causality note says it does)."""
    device = resolve_device(device)
    budget_settings = resolve_budget(budget, device)
    seeds = _check_seeds(seeds)
    _refuse_foreign_results(out, overwrite=False)
    register_leaky_refiner()
    corpora = [str(corpus) for corpus in corpora]
    if len(corpora) < 1 or len(set(corpora)) != len(corpora):
        raise ValueError(f"corpora must name at least one corpus, each once; got {corpora}")
    for corpus in corpora:
        _check_corpus_fits(corpus, budget_settings, budget_settings.train_lengths)
    out = Path(out)
    for overrides in MODELS.values():   # C4's leaky model reads the future on purpose: the report says it does
        if overrides.get("refiner") != LEAKY_REFINER:
            check_no_leak(_lm_config(budget_settings, budget_settings.train_lengths[0], overrides))
    check_settings(out, {"command": "reproduce", "budget": budget, "settings": dataclasses.asdict(budget_settings),
                         "corpora": corpora, "device": device.type})
    plan = study_plan(corpora, budget_settings)
    # Seeds outermost: a study stopped early has every model (and task) at its first seeds, not some at all.
    runs = [(seed, kind, where, label) for seed in range(seeds)
            for kind, where, labels in ([("lm", place, labels) for place, labels in plan.items()]
                                        + [("che", task, tuple(CHE_MODELS)) for task in CHE_TASKS])
            for label in labels]
    meter = Progress(len(runs), progress)
    started = time.perf_counter()
    if progress:
        count = sum(kind == "lm" for _, kind, _, _ in runs)
        print(f"minidape reproduce on {device}: budget {budget} ({budget_settings.n_layer} layers x "
              f"{budget_settings.n_embd}, {budget_settings.steps} steps of {budget_settings.batch_size} windows), "
              f"{seeds} seeds, corpora {', '.join(corpora)}: {count} language models and {len(runs) - count} "
              f"CHE encoders -> {out}", flush=True)
    # A second `reproduce` into the same folder (another terminal) shares the work: each run is taken by one
    # process through a lock file; runs another live process holds are waited for at the end.
    waiting = runs
    while waiting:
        held = []
        for seed, kind, where, label in waiting:
            path, what = _run_place(out, kind, where, label, seed)
            if path.is_file():
                meter.report(what, None)
                continue
            with file_lock(path.with_name(path.name + ".lock")) as holder:     # one process per run
                if holder is not None:
                    held.append((seed, kind, where, label))
                    continue
                result, detail = _run_one(kind, where, label, seed, budget_settings, device)
                _write_json(path, {"label": label, **result})
            meter.report(what, result["train_seconds"] + result["eval_seconds"], detail)
        if held and progress and len(held) == len(waiting):
            print(f"waiting for {len(held)} runs that another process is training", flush=True)
        if held:
            time.sleep(10 if len(held) == len(waiting) else 0)
        waiting = held
    results = collect_results(out, plan, seeds)
    report = write_report(out, results, corpora, budget, budget_settings, seeds, device,
                          command or _command_line(budget, seeds, corpora, out),
                          time.perf_counter() - started, trained=meter.timed)
    if progress:
        print(report["summary"])
        print(f"wrote {out / 'REPRODUCTION.md'}, {out / 'results.json'} and {out / 'figures'}/")
    return report


def _run_place(out: Path, kind: str, where, label: str, seed: int) -> tuple[Path, str]:
    """The result file of one run and its name in the progress lines."""
    if kind == "lm":
        corpus, train_length = where
        return (_lm_run_path(out, corpus, train_length, label, seed),
                f"{_corpus_key(corpus)} T={train_length} {label} seed {seed}")
    return _che_run_path(out, where, label, seed), f"CHE {where} {label} seed {seed}"


def _run_one(kind: str, where, label: str, seed: int, budget: Budget, device: torch.device) -> tuple[dict, str]:
    """Train and evaluate one run of the study: (its result, a progress detail)."""
    if kind == "lm":
        corpus, train_length = where
        result = train_and_evaluate(_lm_config(budget, train_length, MODELS[label]), corpus, budget, seed, device,
                                    allow_leakage=MODELS[label].get("refiner") == LEAKY_REFINER)
        return {"train_length": train_length, **result}, _perplexity_summary(result)
    result = che_train_and_evaluate(where, _che_config(budget, CHE_MODELS[label]), budget, seed, device)
    return result, f", accuracy beyond training {100 * result['mean_beyond_train']:.1f}%"


def _command_line(budget: str, seeds: int, corpora: list[str], out: Path) -> str:
    return (f"python -m minidape reproduce --budget {budget} --seeds {seeds} --corpus {' '.join(corpora)} "
            f"--out {out}")


def collect_results(out: Path, plan: dict, seeds: int) -> dict:
    """Every run's numbers, as lists over seeds: ``lm[(corpus, T, label)][protocol][length]`` and
    ``che[(task, label)]`` (mean accuracy beyond training), ``che_within[(task, label)]`` (within it: did the
    model learn the task?), ``che_curves[(task, label)][n]`` and ``che_chance[task]``."""
    lm, che, che_within, che_curves, che_chance, seconds = {}, {}, {}, {}, {}, []
    for (corpus, train_length), labels in plan.items():
        for label in labels:
            runs = [_read_json(_lm_run_path(out, corpus, train_length, label, seed)) for seed in range(seeds)]
            seconds += [run["train_seconds"] + run["eval_seconds"] for run in runs]
            lm[(corpus, train_length, label)] = {
                protocol: {int(length): [_nan(run["perplexity"][protocol][length]) for run in runs]
                           for length in runs[0]["perplexity"][protocol]}
                for protocol in PROTOCOLS}
    for task in CHE_TASKS:
        for label in CHE_MODELS:
            runs = [_read_json(_che_run_path(out, task, label, seed)) for seed in range(seeds)]
            seconds += [run["train_seconds"] + run["eval_seconds"] for run in runs]
            che[(task, label)] = [run["mean_beyond_train"] for run in runs]
            che_within[(task, label)] = [_nan(run["mean_within_train"]) for run in runs]
            che_curves[(task, label)] = {int(n): [run["accuracy"][n] for run in runs] for n in runs[0]["accuracy"]}
            che_chance[task] = runs[0]["chance"]
    return {"lm": lm, "che": che, "che_within": che_within, "che_curves": che_curves, "che_chance": che_chance,
            "runs": len(seconds), "run_seconds": sum(seconds)}


def _endpoint_lengths(statement: Statement, train_length: int, lengths) -> list[int]:
    """The evaluation lengths a perplexity statement averages over (``degrades``/``flat``: 16 x only, or the
    longest length of a budget that stops before it)."""
    if statement.kind in ("degrades", "flat"):
        return [16 * train_length if 16 * train_length in lengths else max(lengths)]
    return [length for length in lengths if statement.lengths == "all" or length > train_length]


def statement_units(statement: Statement, results: dict, corpora: list[str], train_lengths) -> dict[str, float]:
    """The endpoint of `statement` in each unit: ``{unit: value}`` (see `Statement`)."""
    if statement.task is not None:
        model = results["che"][(statement.task, statement.model)]
        other = results["che"][(statement.task, statement.other)]
        return {f"seed {seed}": 100 * (a - b) for seed, (a, b) in enumerate(zip(model, other))}
    units = {}
    for corpus, train_length in _scope_places(statement.scope, corpora, train_lengths):
        model = results["lm"][(corpus, train_length, statement.model)]
        other = results["lm"][(corpus, train_length, statement.other or statement.model)]
        lengths = _endpoint_lengths(statement, train_length, model[PROTOCOLS[0]])
        for seed in range(len(model[PROTOCOLS[0]][train_length])):
            differences = [math.log(model[protocol][length][seed])
                           - math.log(other[protocol][length if statement.other else train_length][seed])
                           for protocol in PROTOCOLS for length in lengths]
            units[f"{_corpus_key(corpus)} T={train_length} seed {seed}"] = (
                sum(differences) / len(differences) - math.log(statement.factor))
    return units


def statement_cells(statement: Statement, results: dict, corpora: list[str], train_lengths) -> list[Cell]:
    """The cells shown under a statement: every corpus, protocol and length (``degrades``/``flat``: each length
    beyond training against the training length); C6: each test length beyond training."""
    if statement.task is not None:
        model = results["che_curves"][(statement.task, statement.model)]
        other = results["che_curves"][(statement.task, statement.other)]
        return [Cell(f"accuracy {n}", model[n], other[n], log=False) for n in model if n > CHE_MAX_TRAIN_LENGTH]
    cells = []
    for corpus, train_length in _scope_places(statement.scope, corpora, train_lengths):
        model = results["lm"][(corpus, train_length, statement.model)]
        other = results["lm"][(corpus, train_length, statement.other or statement.model)]
        for protocol in PROTOCOLS:
            for length in model[protocol]:
                if (statement.lengths == "beyond" or not statement.other) and length <= train_length:
                    continue
                against = other[protocol][length if statement.other else train_length]
                cells.append(Cell(f"{_corpus_key(corpus)} T={train_length} {protocol} {length // train_length}xT",
                                  model[protocol][length], against))
    return cells


def judge(results: dict, corpora: list[str], train_lengths, claims=CLAIMS) -> list[dict]:
    """Every statement of the report: its units, endpoint, Holm-adjusted p and verdict (in `CLAIMS` order)."""
    judged = []
    for claim in claims:
        for statement in claim.statements:
            units = statement_units(statement, results, corpora, train_lengths)
            judged.append({"claim": claim.key, "statement": statement, "units": units,
                           "endpoint": Endpoint(list(units.values()), KINDS[statement.kind], statement.margin)})
    # A C6 task that no model learned within its training lengths cannot show which model extrapolates (two
    # models at chance are "near-equal" trivially): its statement is not tested and leaves Holm's family.
    unlearned = set(unlearned_tasks(results)) if any(claim.che for claim in claims) else set()
    tested = [item for item in judged if item["statement"].task not in unlearned]
    for item, p_holm in zip(tested, holm([item["endpoint"].p for item in tested])):
        item["p_holm"] = p_holm
        item["verdict"] = verdict(item["endpoint"], p_holm)
    for item in judged:
        if item["statement"].task in unlearned:
            item["p_holm"], item["verdict"] = math.nan, NOT_TESTED
    return judged


def unlearned_tasks(results: dict) -> list[str]:
    """C6 tasks on which no model is `LEARNED_MARGIN` above chance within the training lengths."""
    return [task for task in CHE_TASKS
            if all(mean_std(results["che_within"][(task, label)])[0] < results["che_chance"][task] + LEARNED_MARGIN
                   for label in CHE_MODELS)]


def _estimate_text(statement: Statement, endpoint: Endpoint) -> str:
    """The endpoint and its 95 % CI in the statement's units: % of perplexity per byte, or accuracy points."""
    if statement.task is not None:
        return f"{endpoint.estimate:+.1f} [{endpoint.low:+.1f}, {endpoint.high:+.1f}] points"
    return _ratio_text(endpoint, math.log(statement.factor))   # the plain ratio; the threshold is in the statement


def _ratio_text(endpoint: Endpoint, shift: float = 0.0) -> str:
    """A log-ratio endpoint as "ratio - 1" in %, with its 95 % CI."""
    if math.isnan(endpoint.estimate):
        return "n/a"
    estimate, low, high = (100 * math.expm1(value + shift)
                           for value in (endpoint.estimate, endpoint.low, endpoint.high))
    return f"{estimate:+.1f} % [{low:+.1f}, {high:+.1f}]"


def _endpoint_text(statement: Statement) -> str:
    """What the endpoint is and what the statement claims about it, with units."""
    if statement.task is not None:
        what = (f"accuracy of {statement.model} minus {statement.other}, points, mean over the test lengths "
                f"beyond {CHE_MAX_TRAIN_LENGTH}, per seed")
        claimed = "above 0" if statement.kind == "higher" else f"within ±{NEAR_MARGIN:.0f} points"
        return f"{what}; claimed {claimed}"
    per = "per (corpus, seed)"
    if statement.kind in ("degrades", "flat"):
        claimed = "above 0 %" if statement.kind == "degrades" else (
            f"within ±{FLAT_MARGIN:.0%} (a log ratio within ±log {1 + FLAT_MARGIN:g}, i.e. "
            f"{100 * (1 / (1 + FLAT_MARGIN) - 1):+.1f} % to {FLAT_MARGIN:+.0%})")
        return (f"perplexity per byte of {statement.model} at 16x the training length over it at 1x, minus 1 "
                f"(geometric mean of both protocols), {per}; claimed {claimed}")
    lengths = "lengths beyond the training length" if statement.lengths == "beyond" else "all evaluation lengths"
    threshold = "below 0 %" if statement.factor == 1 else f"below {100 * (statement.factor - 1):+.0f} %"
    return (f"perplexity per byte of {statement.model} over {statement.other}, minus 1 (geometric mean over both "
            f"protocols and {lengths}), {per}; claimed {threshold}")


# ----------------------------------------------------------------------------- report: tables and figures


def _curve_table(results: dict, corpus: str, train_length: int, protocol: str, labels) -> str:
    runs = {label: results["lm"][(corpus, train_length, label)][protocol] for label in labels
            if (corpus, train_length, label) in results["lm"]}
    lengths = sorted({length for curve in runs.values() for length in curve})
    header = ["model"] + [f"{length}" + (" (train)" if length == train_length else "") for length in lengths]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * len(lengths)]
    for label, curve in runs.items():
        lines.append("| " + " | ".join([label] + [format_mean_std(curve[length]) for length in lengths]) + " |")
    return "\n".join(lines) + "\n"


def _cells_table(cells: list[Cell]) -> str:
    """Rows: corpus / training length / protocol; columns: evaluation lengths; entries: signed difference, p."""
    rows: dict[str, dict[str, str]] = {}
    columns: list[str] = []
    for cell in cells:
        row, _, column = cell.where.rpartition(" ")
        rows.setdefault(row, {})[column] = cell.text()
        if column not in columns:
            columns.append(column)
    lines = ["| where | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for row, entries in rows.items():
        lines.append(f"| {row} | " + " | ".join(entries.get(column, "") for column in columns) + " |")
    return "\n".join(lines) + "\n"


def plot_bands(curves: dict[str, dict[int, list[float]]], ax, train_length: int | None = None,
               ylabel: str = "perplexity per byte", log_y: bool = True) -> None:
    """Mean over seeds as a line and mean ± std as a shaded band, one per model in its fixed style
    (`md.plots.model_style`); NaN points left out."""
    for label, curve in curves.items():
        points = [(length, *mean_std(values)) for length, values in sorted(curve.items())]
        points = [point for point in points if not math.isnan(point[1])]
        if not points:
            continue
        lengths, means, stds = zip(*points)
        style = model_style(label)
        ax.plot(lengths, means, marker="o", markersize=3, label=label, **style)
        ax.fill_between(lengths, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                        color=style["color"], alpha=0.15)
    ax.set_xscale("log", base=2)
    ticks = []
    for length in sorted({length for curve in curves.values() for length in curve}):
        if not ticks or length >= 1.15 * ticks[-1]:     # neighbours like 40 and 41 would print on each other
            ticks.append(length)
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FormatStrFormatter("%d"))
    if log_y:
        ax.set_yscale("log")
        # Plain numbers: matplotlib's default 10^k labels go through mathtext, most of a figure's drawing time.
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))   # perplexities span less than a decade here
    ax.xaxis.set_minor_formatter(NullFormatter())
    if train_length is not None:
        ax.axvline(train_length, color="gray", linestyle="--", linewidth=1)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def _figure_legend(fig, axes) -> None:
    """One legend for the whole figure, every model drawn in any panel once (its style is the same in all)."""
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=min(len(handles), 5),
               fontsize="small")


def _claim_figure(claim: Claim, results: dict, places: list[tuple[str, int]], path: Path) -> None:
    fig, axes = plt.subplots(len(places), len(PROTOCOLS), figsize=(6 * len(PROTOCOLS), 3.6 * len(places) + 0.8),
                             squeeze=False, layout="constrained")
    for row, (corpus, train_length) in enumerate(places):
        for column, protocol in enumerate(PROTOCOLS):
            ax = axes[row][column]
            curves = {label: results["lm"][(corpus, train_length, label)][protocol] for label in claim.models
                      if (corpus, train_length, label) in results["lm"]}
            plot_bands(curves, ax, train_length)
            ax.set_title(f"{_corpus_key(corpus)}, trained at {train_length}, {protocol}", fontsize="medium")
            ax.set_xlabel("evaluation length")
    _figure_legend(fig, axes.flat)
    fig.suptitle(f"{claim.key}: {claim.title}", fontsize="medium")
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def _che_figure(results: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, len(CHE_TASKS), figsize=(4.5 * len(CHE_TASKS), 4.2), squeeze=False,
                             layout="constrained")
    for ax, task in zip(axes[0], CHE_TASKS):
        curves = {label: {n: [100 * acc for acc in values]
                          for n, values in results["che_curves"][(task, label)].items()} for label in CHE_MODELS}
        plot_bands(curves, ax, CHE_MAX_TRAIN_LENGTH, ylabel="accuracy (%)", log_y=False)
        ax.set_title(task, fontsize="medium")
        ax.set_xlabel("input length")
    _figure_legend(fig, axes.flat)
    fig.suptitle("C6: accuracy by test length (mean ± std over seeds)", fontsize="medium")
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def _machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _statement_block(item: dict) -> str:
    statement, endpoint = item["statement"], item["endpoint"]
    return (f"**{statement.text}** — *{item['verdict']}*. Endpoint: {_endpoint_text(statement)}. "
            f"Estimate {_estimate_text(statement, endpoint)} (95 % CI, {len(item['units'])} units); "
            f"t-test {_format_p(endpoint.p)}, sign-flip {_format_p(endpoint.p_sign_flip)}, Holm-adjusted "
            f"{_format_p(item['p_holm'])}.\n\n")


def write_report(out: Path, results: dict, corpora: list[str], budget_name: str, budget: Budget, seeds: int,
                 device: torch.device, command: str, wall_seconds: float, trained: int) -> dict:
    """REPRODUCTION.md, results.json and figures/ from the collected runs; returns the verdicts."""
    figures = out / "figures"
    judged = judge(results, corpora, budget.train_lengths)
    sections, claim_rows, statement_rows, verdicts = [], [], [], {}
    for claim in CLAIMS:
        items = [item for item in judged if item["claim"] == claim.key]
        overall = claim_verdict([item["verdict"] for item in items])
        claim_rows.append(f"| {claim.key} | {claim.title} | {claim.source} | **{overall}** |")
        parts = []
        for item in items:
            statement, endpoint = item["statement"], item["endpoint"]
            cells = statement_cells(statement, results, corpora, budget.train_lengths)
            statement_rows.append(f"| {claim.key} | {statement.text} | {_estimate_text(statement, endpoint)} | "
                                  f"{_format_p(endpoint.p)} | {_format_p(endpoint.p_sign_flip)} | "
                                  f"{_format_p(item['p_holm'])} | {item['verdict']} |")
            verdicts.setdefault(claim.key, []).append(
                {"statement": statement.text, "kind": statement.kind, "verdict": item["verdict"],
                 "units": item["units"], "estimate": endpoint.estimate, "ci95": [endpoint.low, endpoint.high],
                 "p_t": endpoint.p, "p_sign_flip": endpoint.p_sign_flip, "p_holm": item["p_holm"],
                 "cells": {cell.where: {"difference": cell.difference(), "p": cell.p()} for cell in cells}})
            unit = "accuracy points" if claim.che else "% of perplexity per byte"
            against = f"against {statement.other}" if statement.other else "at each length against the training length"
            parts.append(_statement_block(item) + f"Per cell ({unit}, {statement.model} {against}, mean over seeds; p "
                         f"of the paired t-test over seeds, not adjusted, descriptive):\n\n" + _cells_table(cells))
        if claim.che:
            tables = _che_table(results)
            _che_figure(results, figures / f"{claim.key}.png")
        else:
            places = sorted({place for statement in claim.statements
                             for place in _scope_places(statement.scope, corpora, budget.train_lengths)},
                            key=lambda place: (corpora.index(place[0]), -place[1]))
            tables = "".join(f"*{_corpus_key(corpus)}, trained at {train_length}, {protocol}* (perplexity per "
                             f"byte, mean ± std over {seeds} seeds):\n\n"
                             f"{_curve_table(results, corpus, train_length, protocol, claim.models)}\n"
                             for corpus, train_length in places for protocol in PROTOCOLS)
            _claim_figure(claim, results, places, figures / f"{claim.key}.png")
        extra = {"C1": _learned_ape_note(budget) + _unigram_note(results, claim, corpora, budget),
                 "C4": _causality_note(budget)}.get(claim.key, "")
        sections.append(f"## {claim.key}: {claim.title}\n\nSource: {claim.source}. Verdict: **{overall}**.\n\n"
                        f"**The paper.** {claim.paper}\n\n**Ours.**\n\n{tables}{extra}\n"
                        f"![{claim.key}](figures/{claim.key}.png)\n\n**Tests.**\n\n" + "\n".join(parts))
    summary = ("| claim | what it says | source | verdict |\n|---|---|---|---|\n" + "\n".join(claim_rows) + "\n\n"
               "| claim | statement | estimate [95 % CI] | p (t) | p (sign-flip) | p (Holm) | verdict |\n"
               "|---|---|---|---|---|---|---|\n" + "\n".join(statement_rows) + "\n")
    header = (f"# Reproduction of the papers' claims\n\nMade by `{command}` (minidape commit {_commit()}) on "
              f"{device.type} ({_machine()}). Wall time of this invocation {_clock(wall_seconds)}, in which it "
              f"trained {trained} of the {results['runs']} runs (the others it found done, by an earlier or a "
              f"concurrent invocation); the runs' own training and evaluation time adds up to "
              f"{_clock(results['run_seconds'])}.\n\n"
              f"{_budget_text(budget_name, budget, seeds, corpora)}\n\n## Summary\n\n{summary}\n"
              f"**Verdict rule.** {VERDICT_RULE}\n\n")
    markdown = header + "\n\n".join(sections) + "\n"
    with atomic_path(out / "REPRODUCTION.md") as tmp:
        tmp.write_text(markdown)
    payload = {"budget": budget_name, "settings": dataclasses.asdict(budget), "seeds": seeds, "corpora": corpora,
               "device": device.type, "verdicts": verdicts,
               "perplexity": {f"{corpus} T={train_length} {label}": curves
                              for (corpus, train_length, label), curves in results["lm"].items()},
               "che_accuracy_beyond_train": {f"{task} {label}": values
                                             for (task, label), values in results["che"].items()},
               "che_accuracy_within_train": {f"{task} {label}": values
                                             for (task, label), values in results["che_within"].items()}}
    _write_json(out / "results.json", payload)
    return {"summary": summary, "verdicts": verdicts, "markdown": markdown}


def _budget_text(name: str, budget: Budget, seeds: int, corpora: list[str]) -> str:
    lengths = ", ".join(str(length) for length in budget.train_lengths)
    extra = " (the others only for C1, on the first corpus)" if len(budget.train_lengths) > 1 else ""
    scored = min(budget.last_k, budget.train_lengths[-1])
    return (f"**Budget `{name}`.** {seeds} seeds; corpora {', '.join(corpora)} (byte-level: every perplexity "
            f"here is per byte). Language models: {budget.n_layer} layers, n_embd {budget.n_embd}, "
            f"{budget.n_head} heads, refiner width 32; {budget.steps} AdamW steps of {budget.batch_size} windows, "
            f"lr {budget.lr} (cosine, 5% warmup); training length{'s' if extra else ''} {lengths}{extra}; "
            f"evaluation at the training length x {', '.join(map(str, budget.eval_factors))}. The same tokens "
            f"are scored at every length, for every model and seed: `last_k` scores {budget.eval_windows} "
            f"disjoint stretches of {scored} tokens (min(last_k = {budget.last_k}, the training length)), "
            f"placed once over the whole validation split, each length reading the window that ends at them; "
            f"`nonoverlap` scores the first {budget.nonoverlap_tokens} predictions of the validation split, cut "
            f"into windows of the length. CHE encoders (C6): the same size, bidirectional, randomized positions "
            f"drawn from [0, {budget.che_random_positions}), {budget.che_steps} Adam steps of "
            f"{budget.che_batch_size}, training lengths 1–{CHE_MAX_TRAIN_LENGTH}, tested at lengths "
            f"{_che_lengths_text(budget.che_test_lengths)} with {budget.che_eval_samples} sequences each. The "
            f"papers train 125M-parameter models for 50k steps (CHE: 200k steps): this is a far smaller study, "
            f"and its verdicts are about this budget.")


def _che_lengths_text(lengths: tuple[int, ...]) -> str:
    within = [n for n in lengths if n <= CHE_MAX_TRAIN_LENGTH]
    beyond = ", ".join(str(n) for n in lengths if n > CHE_MAX_TRAIN_LENGTH)
    return (f"{', '.join(map(str, within))} (within training) and " if within else "") + \
        f"{beyond} (spread over {CHE_MAX_TRAIN_LENGTH + 1}–500, as the paper averages them)"


def _learned_ape_note(budget: Budget) -> str:
    """Learned APE past its table, shown by trying: no statistic, it cannot run."""
    train_length = budget.train_lengths[0]
    model = GPT(GPTConfig(n_layer=1, n_embd=budget.n_embd, n_head=budget.n_head, block_size=train_length,
                          pe="learned")).eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, 2 * train_length, dtype=torch.long))
        outcome = "it ran (unexpected: the table should end at the training length)"
    except ValueError as err:
        outcome = f"minidape refuses: \"{err}\""
    return (f"\n**learned APE: cannot run** past the training length, so it is not tested (a model with a "
            f"position table of {train_length} entries, asked for {2 * train_length} tokens: {outcome}). "
            f"Sinusoidal APE, which runs at any length, stands for absolute positions in the tests.\n")


def unigram_perplexity(corpus: str) -> float:
    """Perplexity per byte on the validation split of byte frequencies alone (counted on the training split,
    add-one smoothed): the level of a model that has learned no context at all."""
    counts = torch.bincount(load_corpus(corpus, "train").long(), minlength=256).double() + 1
    log_probs = (counts / counts.sum()).log()
    return math.exp(-log_probs[load_corpus(corpus, "val").long()].mean().item())


def _unigram_note(results: dict, claim: Claim, corpora: list[str], budget: Budget) -> str:
    """Which of the claim's models ended training no better than byte frequencies (a flat curve there is no
    evidence of extrapolation: the model reads no context at any length)."""
    train_length = budget.train_lengths[0]
    levels, stuck = [], []
    for corpus in corpora:
        unigram = unigram_perplexity(corpus)
        levels.append(f"{_corpus_key(corpus)} {unigram:.2f}")
        for label in claim.models:
            curves = results["lm"].get((corpus, train_length, label))
            if curves and mean_std(curves["nonoverlap"][train_length])[0] > UNIGRAM_SHARE * unigram:
                level = format_mean_std(curves["nonoverlap"][train_length])
                stuck.append(f"{label} on {_corpus_key(corpus)} ({level})")
    verdict = (f"At the training length (`nonoverlap`) these stay above {UNIGRAM_SHARE:.0%} of it, i.e. learned little "
               f"more than byte frequencies at this budget, so their curves say little about extrapolation: "
               f"{'; '.join(stuck)}." if stuck else
               f"Every model here ends training below {UNIGRAM_SHARE:.0%} of it.")
    return (f"\nReference: byte frequencies alone (no context) give a perplexity per byte of "
            f"{', '.join(levels)} on the validation split. {verdict}\n")


def _causality_note(budget: Budget) -> str:
    cfg = dict(n_layer=1, n_embd=budget.n_embd, n_head=budget.n_head, block_size=64, pe="kerple_log")
    leaky = not check_causal(GPTConfig(refiner=LEAKY_REFINER, **cfg))
    causal = check_causal(GPTConfig(refiner="conv", **cfg))
    return (f"\nCausality check (perturb every token after position t, compare the logits at positions ≤ t, "
            f"fresh models): `conv` (with tril) reads no future: **{causal}**; `conv_no_tril` reads the "
            f"future: **{leaky}**.\n")


def _che_table(results: dict) -> str:
    columns = [(label, "che_within", f"{label} within 1–{CHE_MAX_TRAIN_LENGTH}") for label in CHE_MODELS] + \
              [(label, "che", f"{label} beyond") for label in CHE_MODELS]
    lines = ["| task | chance | " + " | ".join(title for _, _, title in columns) + " |",
             "|---|" + "---:|" * (len(columns) + 1)]
    for task in CHE_TASKS:
        lines.append(f"| {task} | {100 * results['che_chance'][task]:.0f} | " + " | ".join(
            format_mean_std([100 * v for v in results[key][(task, label)]]) for label, key, _ in columns) + " |")
    # A task no model learned on the lengths it was trained on cannot tell which one extrapolates better.
    unlearned = unlearned_tasks(results)
    if unlearned:
        learned = (f"Within the training lengths no model is {100 * LEARNED_MARGIN:.0f} points above chance on "
                   f"{', '.join(unlearned)}: this budget did not learn "
                   f"{'that task' if len(unlearned) == 1 else 'those tasks'}, "
                   "so the comparison there cannot show which model extrapolates better. ")
    else:
        learned = (f"Every task is learned within the training lengths ({100 * LEARNED_MARGIN:.0f} points above "
                   "chance or more) by at least one model. ")
    classifier = "a classifier separate from the input embedding (`tie_embeddings=False`), as in the benchmark"
    return ("Accuracy (%) within the training lengths (the tested lengths up to "
            f"{CHE_MAX_TRAIN_LENGTH}) and beyond them (the papers' score), each the mean over the tested lengths, "
            "then mean ± std over seeds:\n\n" + "\n".join(lines) + f"\n\n{learned}"
            "The encoder: bidirectional attention (`causal=False`), answer "
            f"placeholders appended to the input, the answer read at those positions, {classifier}. The "
            "refiner's input mask is all-True in encoder mode, so minidape's conv refiner applies no tril there "
            "(the authors' listing applies it unconditionally); C6 uses DAPE's MLP, for which tril plays no "
            "role.\n")


# ----------------------------------------------------------------------------- compare

_LOADED_FILES: dict[tuple[str, str], str] = {}   # (resolved file, class) -> the name it was registered under


def resolve_pe(pe: str) -> tuple[str, str | None]:
    """A registered PE name, or ``path/to/file.py:ClassName`` loaded and registered on the fly; returns
    ``(name, sha256 of the file or None)``. The class must subclass ``md.AdditiveBias``."""
    if ":" not in pe or pe in PE_NAMES:
        if pe not in PE_NAMES:
            raise ValueError(f"unknown pe {pe!r}; valid choices: {', '.join(PE_NAMES)}, or FILE.py:ClassName")
        return pe, None
    file_name, _, class_name = pe.rpartition(":")
    path = user_path(file_name, "--pe")
    if not path.is_file():
        raise FileNotFoundError(f"--pe {pe!r}: no file {str(path)!r}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    key = (str(path.resolve()), class_name)
    if key in _LOADED_FILES:
        return _LOADED_FILES[key], digest
    spec = importlib.util.spec_from_file_location(f"minidape_user_{_slug(path.stem)}_{digest[:8]}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the user's file: any error there is theirs, reported in one line
        del sys.modules[spec.name]
        raise ValueError(f"--pe {pe!r}: importing {path} failed: {type(err).__name__}: {err}") from err
    cls = getattr(module, class_name, None)
    if cls is None:
        found = [name for name, value in vars(module).items() if isinstance(value, type)
                 and issubclass(value, AdditiveBias) and value is not AdditiveBias]
        raise ValueError(f"--pe {pe!r}: {path} defines no {class_name!r}; AdditiveBias classes there: "
                         f"{', '.join(found) or 'none'}")
    if not (isinstance(cls, type) and issubclass(cls, AdditiveBias)):
        raise ValueError(f"--pe {pe!r}: {class_name} is not a subclass of md.AdditiveBias (a bias "
                         f"(n_head, Tq, Tk) from positions); see the extension API in the README")
    registered = [name for name, value in PE_REGISTRY.items() if value is cls]  # the file may register it itself
    name = registered[0] if registered else f"{_slug(path.stem)}:{class_name}"
    if not registered:
        register_pe(name)(cls)
    _LOADED_FILES[key] = name
    return name, digest


def _model_spec(name: str, what: str) -> dict:
    """``pe`` or ``pe+refiner`` -> GPTConfig overrides, with errors naming the valid choices."""
    pe, _, refiner = name.partition("+")
    if pe not in PE_NAMES:
        raise ValueError(f"unknown {what} {name!r}; valid choices: {', '.join(PE_NAMES)} (optionally +refiner)")
    if refiner and refiner not in REFINER_NAMES:
        raise ValueError(f"unknown refiner {refiner!r} in {what} {name!r}; valid choices: {', '.join(REFINER_NAMES)}")
    return {"pe": pe, "refiner": refiner or "none"}


def _refuse_foreign_results(out, overwrite: bool) -> None:
    """A folder holding results without this module's manifest (another command's, or a user's own files) is
    not written into unless `overwrite`; an earlier compare or reproduce there (its manifest) is resumed."""
    if out is not None and not (Path(out) / "manifest.json").is_file():
        refuse_to_replace(out, RESULT_FILES, overwrite)


@holds_out_folder()
def compare(pe: str, refiner: str = "none", against=("alibi", "kerple_log"), seeds: int = 3,
            steps: int | None = None, corpus: str = "austen", out=None, *, budget: str = "default",
            device: str | torch.device = "auto", progress: bool = True, overwrite: bool = False,
            allow_leakage: bool = False) -> dict:
    """Put a bias through the study's protocol against baselines; returns the table and the statistics.

    - ``pe``: a registered name or ``path/to/file.py:ClassName`` (an ``md.AdditiveBias`` subclass,
      registered on the fly); ``refiner``: any registered refiner; ``against``: baselines, each ``pe`` or
      ``pe+refiner``.
    - Each model is trained ``seeds`` times at length 128 (``steps`` per run, default the budget's) on
      ``corpus`` (a name or a .txt/.gz path) and evaluated at 128 x 1..16 with both protocols.
    - Returns ``{"table": markdown, "perplexity": {label: {protocol: {length: [ppl per seed]}}},
      "p_values": {baseline: {protocol: {length: p}}}}``; with ``out`` also writes ``compare.md``,
      ``compare.json``, ``compare.png`` and the runs there (resumable; other settings are refused). An ``out``
      holding other results is refused unless ``overwrite``; another process writing there is refused.
    - A model that reads the future (``md.check_causal``) is refused before any training, unless
      ``allow_leakage=True``: then the report's header says which models leak.
    """
    device = resolve_device(device)
    budget_settings = resolve_budget(budget, device)
    seeds = _check_seeds(seeds)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive integer; got {steps!r}")
    if isinstance(against, str):
        against = (against,)
    pe_name, digest = resolve_pe(pe)
    subject = pe_name if refiner == "none" else f"{pe_name}+{refiner}"
    models = {subject: _model_spec(subject, "pe/refiner")}
    for name in against:
        models.setdefault(name, _model_spec(name, "baseline"))
    baselines = [label for label in models if label != subject]
    if not baselines:
        raise ValueError(f"against must name at least one baseline other than {pe}; got {list(against)}")
    train_length = budget_settings.train_lengths[0]
    leaking = [label for label, overrides in models.items()
               if check_no_leak(_lm_config(budget_settings, train_length, overrides), allow_leakage)]
    _refuse_foreign_results(out, overwrite)
    _check_corpus_fits(corpus, budget_settings, (train_length,))
    steps = steps or budget_settings.steps
    out = Path(out) if out is not None else None
    if out is not None:
        check_settings(out, {"command": "compare", "pe": pe, "pe_file_sha256": digest, "refiner": refiner,
                             "corpus": str(corpus), "steps": steps, "budget": budget,
                             "settings": dataclasses.asdict(budget_settings), "device": device.type,
                             **({"leaking": leaking} if leaking else {})})
    meter = Progress(len(models) * seeds, progress)
    perplexity: dict[str, dict[str, dict[int, list[float]]]] = {}
    for label, overrides in models.items():
        runs = []
        for seed in range(seeds):
            path = out / "runs" / _slug(label) / f"seed{seed}.json" if out is not None else None
            if path is not None and path.is_file():
                runs.append(_read_json(path))
                meter.report(f"{label} seed {seed}", None)
                continue
            result = train_and_evaluate(_lm_config(budget_settings, train_length, overrides), str(corpus),
                                        budget_settings, seed, device, steps=steps, allow_leakage=label in leaking)
            if path is not None:
                _write_json(path, {"label": label, **result})
            runs.append(json_ready(result))
            meter.report(f"{label} seed {seed}", result["train_seconds"] + result["eval_seconds"],
                         _perplexity_summary(result))
        perplexity[label] = {protocol: {int(length): [_nan(run["perplexity"][protocol][length]) for run in runs]
                                        for length in runs[0]["perplexity"][protocol]} for protocol in PROTOCOLS}
    # The subject against each baseline, paired by seed: one cell per protocol and length, and one endpoint (the
    # mean log ratio over both protocols and all lengths, per seed) with Holm's adjustment across the baselines.
    cells = {baseline: {protocol: {length: Cell(f"{protocol} {length}", perplexity[subject][protocol][length],
                                                perplexity[baseline][protocol][length])
                                   for length in perplexity[subject][protocol]} for protocol in PROTOCOLS}
             for baseline in baselines}
    p_values = {baseline: {protocol: {length: cell.p() for length, cell in by_length.items()}
                           for protocol, by_length in by_protocol.items()} for baseline, by_protocol in cells.items()}
    endpoints = {baseline: Endpoint([_mean_log_ratio(perplexity[subject], perplexity[baseline], seed)
                                     for seed in range(seeds)], "below") for baseline in baselines}
    adjusted = dict(zip(endpoints, holm([endpoint.p for endpoint in endpoints.values()])))
    table = _compare_table(perplexity, cells, endpoints, adjusted, subject, train_length, seeds)
    if progress:
        print(table)
    if out is not None:
        details = (f"Trained {seeds} seeds x {steps} steps at length {train_length} on {corpus} "
                   f"({budget_settings.n_layer} layers, n_embd {budget_settings.n_embd}, {budget_settings.n_head} "
                   f"heads, budget {budget}, {device.type}).\n")
        if leaking:
            details = (f"> **Leakage experiment (allow_leakage): {', '.join(leaking)} read{'s' if len(leaking) == 1 else ''}"
                       f" the future** (md.check_causal fails): their perplexities and p-values do not measure "
                       f"language modelling.\n\n{details}")
        with atomic_path(out / "compare.md") as tmp:
            tmp.write_text(f"# {subject} against {', '.join(baselines)}\n\n{details}\n{table}")
        _write_json(out / "compare.json", {"subject": subject, "baselines": baselines, "leaking": leaking,
                                           "perplexity": perplexity,
                                           "p_values": p_values, "endpoints": _endpoints_json(endpoints, adjusted),
                                           "steps": steps, "seeds": seeds,
                                           "corpus": str(corpus), "budget": budget})
        fig, axes = plt.subplots(1, len(PROTOCOLS), figsize=(12, 4), squeeze=False)
        for ax, protocol in zip(axes[0], PROTOCOLS):
            plot_bands({label: curves[protocol] for label, curves in perplexity.items()}, ax, train_length)
            ax.set_title(f"{protocol} (mean ± std over {seeds} seeds)", fontsize="medium")
            ax.set_xlabel("evaluation length")
        axes[0][-1].legend(fontsize="small")
        fig.tight_layout()
        save_figure(fig, out / "compare.png")
        plt.close(fig)
        if progress:
            print(f"wrote {out / 'compare.md'}, {out / 'compare.json'} and {out / 'compare.png'}")
    return {"subject": subject, "table": table, "perplexity": perplexity, "p_values": p_values,
            "endpoints": _endpoints_json(endpoints, adjusted)}


def _mean_log_ratio(curves: dict, other: dict, seed: int) -> float:
    """Mean over both protocols and every length of log(ppl) - log(other's ppl), for one seed."""
    ratios = [math.log(curves[protocol][length][seed]) - math.log(other[protocol][length][seed])
              for protocol in PROTOCOLS for length in curves[protocol]]
    return sum(ratios) / len(ratios)


def _endpoints_json(endpoints: dict, adjusted: dict) -> dict:
    return {baseline: {"ratio_minus_1": math.expm1(endpoint.estimate),
                       "ci95": [math.expm1(endpoint.low), math.expm1(endpoint.high)], "p_t": endpoint.p,
                       "p_sign_flip": endpoint.p_sign_flip, "p_holm": adjusted[baseline]}
            for baseline, endpoint in endpoints.items()}


def _compare_table(perplexity: dict, cells: dict, endpoints: dict, adjusted: dict, subject: str, train_length: int,
                   seeds: int) -> str:
    """Per protocol: mean ± std for every model at every length and, per baseline, the subject's signed
    difference with the paired t-test's p; then one endpoint per baseline over both protocols and all lengths."""
    blocks = []
    for protocol in PROTOCOLS:
        lengths = list(perplexity[subject][protocol])
        header = ["model"] + [f"{length}" + (" (train)" if length == train_length else "") for length in lengths]
        lines = [f"**{protocol}** — perplexity per byte, mean ± std over {seeds} seeds; then {subject} against each "
                 "baseline: signed difference (% of perplexity per byte, geometric mean over seeds) and the p of the "
                 "paired t-test on log perplexity (not adjusted)", "",
                 "| " + " | ".join(header) + " |", "|---|" + "---:|" * len(lengths)]
        for label, curves in perplexity.items():
            lines.append("| " + " | ".join([label] + [format_mean_std(curves[protocol][length])
                                                     for length in lengths]) + " |")
        for baseline, by_protocol in cells.items():
            lines.append(f"| vs {baseline} | " + " | ".join(by_protocol[protocol][length].text()
                                                           for length in lengths) + " |")
        blocks.append("\n".join(lines) + "\n")
    rows = [f"| {baseline} | {_ratio_text(endpoint)} | {_format_p(endpoint.p)} | {_format_p(endpoint.p_sign_flip)} | "
            f"{_format_p(adjusted[baseline])} |" for baseline, endpoint in endpoints.items()]
    blocks.append(f"**Endpoint** — {subject}'s perplexity per byte over the baseline's, minus 1: geometric mean over "
                  f"both protocols and all lengths, per seed; mean over {seeds} seeds with its 95 % CI, two-sided "
                  "t-test, exact sign-flip test, Holm-adjusted t-test p across the baselines\n\n"
                  "| baseline | ratio − 1 [95 % CI] | p (t) | p (sign-flip) | p (Holm) |\n|---|---|---|---|---|\n"
                  + "\n".join(rows) + "\n")
    return "\n".join(blocks)


