"""What the study tests: its models (a label -> `GPTConfig` overrides), the papers' claims C1-C6 as statements
with one endpoint each, and the broken-on-purpose refiner of C4."""

from __future__ import annotations

import dataclasses
import math

from ..lab.leakage import ConvRefinerWithoutTril
from ..model import REFINER_NAMES, register_refiner

# ----------------------------------------------------------------------------- the leaky refiner of C4


LEAKY_REFINER = "conv_no_tril"


def register_leaky_refiner() -> None:
    """Register C4's broken refiner, only when the study runs (it is no choice for ordinary models)."""
    if LEAKY_REFINER not in REFINER_NAMES:
        register_refiner(LEAKY_REFINER)(ConvRefinerWithoutTril)


# ----------------------------------------------------------------------------- the study's models

MATCHED_WIDTH = "matched to the 1x3 conv"  # refiner_width placeholder: resolved by `lm_config`

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
    # positions that read the data (issue 33): no claim of the papers, here for `compare` (by label)
    "FoX": {"pe": "fox"},
    "DAPE-FoX": {"pe": "fox", "refiner": "dape"},
    "CoPE": {"pe": "cope"},
    "RoPE/NoPE hybrid": {"pe": "rope,none", "temperature": "learned"},
    # issue 48: FoX as its authors build it and as minidape started it, and the two families that replace softmax
    "FoX (ALiBi init)": {"pe": "fox", "fox_gate_init": "alibi"},
    "FoX Pro": {"pe": "fox", "attention_extras": "pro"},
    "PaTH": {"pe": "path"},
    "Stick-breaking": {"pe": "stick_breaking"},
    # the published RoPE/NoPE hybrids (``model.layer_specs``), four layers for their 3:1 pattern, windows of 32
    # tokens (a quarter of the study's training length, our choice)
    "RNoPE-SWA": {"pe": "rope@sliding=32,rope@sliding=32,rope@sliding=32,none", "n_layer": 4},
    "iRoPE": {"pe": "rope@chunk=32,rope@chunk=32,rope@chunk=32,none@temp=llama4", "n_layer": 4},
    "SWAN": {"pe": "none@temp=log_length,rope@sliding=32,rope@sliding=32,rope@sliding=32", "n_layer": 4},
}
CHE_MODELS = {"Kerple-log": {"pe": "kerple_log"}, "DAPE-Kerple": {"pe": "kerple_log", "refiner": "dape"}}
CHE_TASKS = ("missing_duplicate_string", "even_pairs", "reverse_string", "bucket_sort")

# Where a statement is tested: "everywhere" = every corpus at the main training length and the first corpus at
# the budget's other training lengths (none in the CPU budgets); "main" = every corpus at the main length;
# "first" = the first corpus, main length.
SCOPES = ("everywhere", "main", "first")
# What a statement claims about its endpoint (see `Statement`): the claimed side of zero, or within a margin.
KINDS = {"lower": "below", "degrades": "above", "flat": "within", "higher": "above", "near": "within"}
FLAT_MARGIN = 0.10  # "stays near its perplexity per byte at the training length": within ±10 % (as a ratio)
NEAR_MARGIN = 5.0  # C6 "near-equal": accuracies within ±5 points
NOT_TESTED = "not tested: no model learned the task"  # C6 verdict of a task no model learned within training
LEARNED_MARGIN = 0.1  # a CHE task counts as learned 10 points above chance within 1..40
UNIGRAM_SHARE = 0.9  # a model above 90 % of the byte-frequency perplexity learned (almost) no context


# ----------------------------------------------------------------------------- the claims


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
    lengths: str = "all"  # "all" evaluation lengths, or only those "beyond" the training length
    scope: str = "main"
    task: str | None = None  # C6: the Chomsky-hierarchy task

    @property
    def margin(self) -> float:
        """Half-width of the equivalence band of a ``flat`` / ``near`` statement (log ratio / points)."""
        return math.log1p(FLAT_MARGIN) if self.kind == "flat" else NEAR_MARGIN


@dataclasses.dataclass(frozen=True)
class Claim:
    key: str
    title: str
    source: str
    paper: str  # the paper's own numbers, quoted
    models: tuple[str, ...]  # shown in the claim's tables and figure
    statements: tuple[Statement, ...]
    che: bool = False  # C6: Chomsky-hierarchy accuracy instead of perplexity


def _degrades(model: str) -> Statement:
    return Statement(f"{model} is worse at 16x the training length than at it", "degrades", model, scope="everywhere")


def _stays_near(model: str) -> Statement:
    return Statement(
        f"{model} at 16x the training length stays within ±{FLAT_MARGIN:.0%} of its perplexity per "
        f"byte at the training length",
        "flat",
        model,
        scope="everywhere",
    )


def _lower(model: str, other: str, scope: str = "main", **options) -> Statement:
    return Statement(
        f"{model} has a lower perplexity per byte than {other}", "lower", model, other, scope=scope, **options
    )


def _che(task: str, kind: str) -> Statement:
    text = (
        f"{task}: DAPE-Kerple has a higher accuracy beyond the training lengths than Kerple-log"
        if kind == "higher"
        else f"{task}: DAPE-Kerple and Kerple-log are within ±{NEAR_MARGIN:.0f} points beyond the training lengths"
    )
    return Statement(text, kind, "DAPE-Kerple", "Kerple-log", task=task)


CLAIMS = (
    Claim(
        "C1",
        "NoPE, RoPE and sinusoidal APE degrade past the training length; ALiBi and Kerple stay near their "
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
        (
            _degrades("NoPE"),
            _degrades("RoPE"),
            _degrades("sinusoidal APE"),
            _stays_near("ALiBi"),
            _stays_near("Kerple-log"),
        ),
    ),
    Claim(
        "C2",
        "DAPE-X beats X for X in ALiBi, Kerple, FIRE, at and beyond the training length; the three DAPE "
        "variants against each other",
        "DAPE Table 5 (appendix E) and Figure 5",
        "DAPE Table 5 (arXiv, train 512, 3 seeds, perplexity per token at 512 / 2048 / 8192): ALiBi 4.61 / "
        "4.87 / 4.77 vs DAPE-ALiBi 4.53 / 4.11 / 4.00; Kerple 4.58 / 5.44 / 13.35 vs DAPE-Kerple 4.51 / 4.05 / "
        "3.86; FIRE 4.57 / 30.12 / 308.6 vs DAPE-FIRE 4.49 / 4.28 / 6.16; \"all with p-values less than "
        "0.05\". Figure 5 (DAPE-Kerple, train 128, at 8192): Concat_Residual 5.00, Concat 5.03, Add_Residual "
        "5.17; \"all variants of DAPE surpass the baseline performance of Kerple\" and the concatenating ones "
        "beat Add_Residual. The papers' Kerple is the log variant; since Kerple-power beats Kerple-log at "
        "this budget (C5), DAPE on Kerple-power is tested beside it as a control.",
        (
            "ALiBi",
            "DAPE-ALiBi",
            "Kerple-log",
            "DAPE-Kerple",
            "Kerple-power",
            "DAPE-Kerple-power",
            "FIRE",
            "DAPE-FIRE",
            "DAPE-Kerple Concat",
            "DAPE-Kerple Add_Residual",
        ),
        (
            _lower("DAPE-Kerple", "Kerple-log"),
            _lower("DAPE-Kerple-power", "Kerple-power"),
            _lower("DAPE-ALiBi", "ALiBi", "first"),
            _lower("DAPE-FIRE", "FIRE", "first"),
            _lower("DAPE-Kerple Concat", "Kerple-log", "first"),
            _lower("DAPE-Kerple Add_Residual", "Kerple-log", "first"),
            _lower("DAPE-Kerple", "DAPE-Kerple Add_Residual", "first"),
            _lower("DAPE-Kerple Concat", "DAPE-Kerple Add_Residual", "first"),
        ),
    ),
    Claim(
        "C3",
        "The 1x3 conv refiner (DAPE-V2) beats DAPE (1x1), also at a matched parameter count; kernel sizes 1, 3, 5",
        "DAPE-V2 Table 4 (appendix F) and §4.6",
        "DAPE-V2 Table 4 (train 128; perplexity per token at 128 / 1024 / 8192), arXiv: Kerple 8.30 / 6.91 / "
        "12.59, DAPE-Kerple (1x1) 8.21 / 5.20 / 4.97, 1x3 8.15 / 5.05 / 4.60, 1x5 8.13 / 5.04 / 4.57; Books3: "
        "Kerple 32.10 / 35.75 / 66.23, 1x1 31.49 / 24.31 / 25.01, 1x3 31.07 / 23.57 / 23.52, 1x5 31.02 / "
        "23.57 / 23.71. \"The optimal kernel size may not always be the largest one\" (1x5 vs 1x3 is not "
        "claimed). §4.6: DAPE1x3-Kerple with hidden width 10 (8.16 at 128, 4.74 at 8192) beats DAPE-Kerple "
        "with width 64 (8.21, 4.87) \"at a lower computational cost\". Our control: a DAPE-Kerple whose MLP is "
        "widened to the 1x3 refiner's parameter count.",
        ("Kerple-log", "DAPE-Kerple", "DAPE-Kerple, 1x3's parameters", "DAPE1x3-Kerple", "DAPE1x5-Kerple"),
        (
            _lower("DAPE1x3-Kerple", "DAPE-Kerple", "first"),
            _lower("DAPE1x5-Kerple", "DAPE-Kerple", "first"),
            _lower("DAPE1x3-Kerple", "DAPE-Kerple, 1x3's parameters", "first"),
        ),
    ),
    Claim(
        "C4",
        "Without tril the conv refiner reads the future and its perplexity collapses toward 1; with tril it does not",
        "DAPE-V2 §4.5 and Figure 6",
        "DAPE-V2 §4.5: \"their cheating version can all achieve about zero loss within evaluation length 1024\", "
        "\"the DAPE_{1×3}-Kerple can even achieve zero loss when the evaluation length is extended to 8096\" "
        "(perplexity about 1; the tril version trains normally).",
        ("Kerple-log", "DAPE1x3-Kerple", "DAPE1x3-Kerple without tril"),
        (
            Statement(
                "DAPE1x3-Kerple without tril has less than half the perplexity per byte of DAPE1x3-Kerple",
                "lower",
                "DAPE1x3-Kerple without tril",
                "DAPE1x3-Kerple",
                factor=0.5,
                scope="first",
            ),
        ),
    ),
    Claim(
        "C5",
        "Kerple-log against Kerple-power",
        "KERPLE Table 3",
        "KERPLE Table 3 (train 512, 5 seeds, log / power at 2048 and 16384, perplexity per token): "
        "OpenWebText2 21.6 / 21.9* and 21.4 / 21.6; GitHub 2.86 / 2.90* and 2.75 / 2.76; arXiv 5.22 / 5.26* "
        "and 5.07 / 5.07 (* = the log variant significantly better, paired two-sided t-test, α = 0.05). The "
        "log variant is better or equal everywhere, significantly at about half the lengths.",
        ("Kerple-log", "Kerple-power"),
        (_lower("Kerple-log", "Kerple-power", lengths="beyond"),),
    ),
    Claim(
        "C6",
        "DAPE-Kerple against Kerple on Chomsky-hierarchy tasks, with the paper's signs (train lengths "
        "1-40, test 41-500)",
        "DAPE Table 2 (randomized positions, 200k steps)",
        "DAPE Table 2 (accuracy %, Kerple → DAPE-Kerple, averaged over test lengths 41–500): "
        "missing_duplicate 79.06 → 87.57 and even_pairs 57.50 → 99.58 (gains); reverse_string 71.54 → 70.74 "
        "and bucket_sort 99.38 → 98.81 (near-equal, DAPE slightly *worse*; bucket_sort is permutation-"
        "invariant).",
        tuple(CHE_MODELS),
        (
            _che("missing_duplicate_string", "higher"),
            _che("even_pairs", "higher"),
            _che("reverse_string", "near"),
            _che("bucket_sort", "near"),
        ),
        che=True,
    ),
)
