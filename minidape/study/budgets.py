"""How big and how long: the study's budgets (model size, training, evaluation) and the models they build."""

from __future__ import annotations

import dataclasses

import torch

from ..lab.data import load_corpus
from ..model import GPTConfig
from .claims import MATCHED_WIDTH


@dataclasses.dataclass(frozen=True)
class Budget:
    """Model size, training and evaluation of every run of a study."""

    n_layer: int
    n_embd: int
    n_head: int
    steps: int  # AdamW steps per language model (cosine schedule, 5% warmup)
    batch_size: int
    lr: float
    train_lengths: tuple[int, ...]  # the first is the main one; any others train C1's models on the first corpus
    eval_factors: tuple[float, ...]  # evaluation lengths = training length x these (`eval_lengths`); 1/n
    # (compare's shorter lengths) below the training length, whole numbers from it on
    last_k: int  # last_k scores min(last_k, training length) tokens per window
    eval_windows: int  # scored stretches (windows per length) of the last_k protocol
    nonoverlap_tokens: int  # predictions scored at every length by the nonoverlap protocol
    che_steps: int  # Adam steps per Chomsky-hierarchy encoder
    che_batch_size: int
    che_lr: float
    che_test_lengths: tuple[int, ...]  # a few lengths within 1..40 (did the model learn the task?), then
    # lengths spread evenly over 41..500 (the papers test every length)
    che_eval_samples: int
    che_random_positions: int  # randomized positions: sorted draws from [0, L), L as in the DAPE paper


def _spread(first: int, last: int, count: int) -> tuple[int, ...]:
    """`count` lengths evenly spread over first..last, both included (the papers average over every length)."""
    return tuple(round(first + i * (last - first) / (count - 1)) for i in range(count))


# CPU budgets. "default" (205 runs): 1 h 34 min as two processes sharing the folder on the project's 2-core AMD
# EPYC while other jobs loaded it (load 4-19; the runs' own time 3 h 07 min, a Kerple-log run 30-80 s there
# against about 10 s at load below 1). "small" (the same runs, half the steps, a third of the evaluation): not
# timed with these settings. "tiny" is for the tests only (every code path, no meaning).
BUDGETS = {
    "tiny": Budget(
        n_layer=1,
        n_embd=16,
        n_head=2,
        steps=2,
        batch_size=2,
        lr=3e-3,
        train_lengths=(16, 8),
        eval_factors=(1, 2),
        last_k=8,
        eval_windows=2,
        nonoverlap_tokens=64,
        che_steps=2,
        che_batch_size=2,
        che_lr=1e-3,
        che_test_lengths=(20, 41, 44),
        che_eval_samples=2,
        che_random_positions=128,
    ),
    "small": Budget(
        n_layer=2,
        n_embd=64,
        n_head=4,
        steps=150,
        batch_size=8,
        lr=3e-3,
        train_lengths=(128,),
        eval_factors=(1, 2, 4, 8, 16),
        last_k=256,
        eval_windows=8,
        nonoverlap_tokens=4096,
        che_steps=500,
        che_batch_size=32,
        che_lr=1e-3,
        che_test_lengths=(20, 40) + _spread(41, 500, 6),
        che_eval_samples=16,
        che_random_positions=2048,
    ),
    "default": Budget(
        n_layer=2,
        n_embd=64,
        n_head=4,
        steps=300,
        batch_size=8,
        lr=3e-3,
        train_lengths=(128,),
        eval_factors=(1, 2, 4, 8, 16),
        last_k=256,
        eval_windows=24,
        nonoverlap_tokens=8192,
        che_steps=1000,
        che_batch_size=32,
        che_lr=1e-3,
        che_test_lengths=(20, 40) + _spread(41, 500, 12),
        che_eval_samples=32,
        che_random_positions=2048,
    ),
}
# On CUDA the same budget names pick a larger model, longer training and evaluation to 64x by themselves.
# (Not measured: this session had no GPU.)
CUDA_OVERRIDES = {
    "small": dict(
        n_layer=4,
        n_embd=256,
        n_head=8,
        steps=1000,
        batch_size=32,
        lr=1e-3,
        eval_windows=32,
        nonoverlap_tokens=32768,
        che_steps=1000,
        che_eval_samples=64,
    ),
    "default": dict(
        n_layer=4,
        n_embd=256,
        n_head=8,
        steps=3000,
        batch_size=32,
        lr=1e-3,
        eval_factors=(1, 2, 4, 8, 16, 32, 64),
        eval_windows=32,
        nonoverlap_tokens=65536,
        che_steps=5000,
        che_batch_size=64,
        che_eval_samples=128,
        che_test_lengths=(20, 40) + _spread(41, 500, 24),
    ),
}
BUDGET_NAMES = ("small", "default")  # the public ones; "tiny" is for tests
CHE_MAX_TRAIN_LENGTH = 40  # the papers': train on 1..40, test on 41..500
DEFAULT_CORPORA = ("austen", "python", "latex")
DEFAULT_SEEDS = 5


def resolve_budget(name: str, device: torch.device) -> Budget:
    if name not in BUDGETS:
        raise ValueError(f"unknown budget {name!r}; valid budgets: {', '.join(BUDGET_NAMES)}")
    budget = BUDGETS[name]
    if device.type == "cuda" and name in CUDA_OVERRIDES:
        budget = dataclasses.replace(budget, **CUDA_OVERRIDES[name])
    return budget


def matched_dape_width(n_head: int, conv_width: int = 32, kernel: int = 3) -> int:
    """The DAPE MLP width with (nearly) the parameters of a conv refiner of `conv_width` and `kernel`, both over
    the 2h channels [S, B]: conv W(2h k + 1) + h(W k + 1), MLP D(2h + 1) + h(D + 1)."""
    conv = conv_width * (2 * n_head * kernel + 1) + n_head * (conv_width * kernel + 1)
    return round((conv - n_head) / (3 * n_head + 1))


def lm_config(budget: Budget, train_length: int, overrides: dict) -> GPTConfig:
    """A language model of the budget's size trained at `train_length` (a `MODELS` entry's overrides)."""
    if overrides.get("refiner_width") == MATCHED_WIDTH:
        overrides = {**overrides, "refiner_width": matched_dape_width(budget.n_head)}
    size = dict(n_layer=budget.n_layer, n_embd=budget.n_embd, n_head=budget.n_head, block_size=train_length)
    return GPTConfig(**{**size, **overrides})  # a hybrid's layer pattern may ask for more layers


def che_config(budget: Budget, overrides: dict) -> GPTConfig:
    """The CHE encoder: the LM budget's size and randomized positions as the DAPE papers used them;
    `md.che.task_config` makes it an encoder with its own classifier layer (`tie_embeddings=False`)."""
    return GPTConfig(
        n_layer=budget.n_layer,
        n_embd=budget.n_embd,
        n_head=budget.n_head,
        random_positions=budget.che_random_positions,
        **overrides,
    )


def eval_lengths(budget: Budget, train_length: int) -> list[int]:
    """The evaluation lengths of a model trained at `train_length`."""
    return [round(train_length * factor) for factor in budget.eval_factors]


def check_corpus_fits(corpus: str, budget: Budget, train_lengths) -> None:
    """Fail before any training when a corpus is too short for the budget's training or evaluation."""
    train_tokens, val_tokens = load_corpus(corpus, "train"), load_corpus(corpus, "val")
    longest = max(train_lengths) * max(budget.eval_factors)
    if len(train_tokens) <= max(train_lengths) + 1:
        raise ValueError(
            f"corpus {corpus!r} has {len(train_tokens)} training tokens; the budget trains on "
            f"windows of {max(train_lengths) + 1}: use a larger corpus or the tiny budget"
        )
    scored = min(budget.last_k, min(train_lengths))
    needed = max(longest + budget.eval_windows * scored, budget.nonoverlap_tokens + 1, longest + 1)
    if len(val_tokens) < needed:
        raise ValueError(
            f"corpus {corpus!r} has {len(val_tokens)} validation tokens (its last 10%); the budget "
            f"evaluates up to length {longest}, scores {budget.eval_windows} disjoint stretches of "
            f"{scored} tokens after that much context and {budget.nonoverlap_tokens} tokens in one "
            f"stretch, which needs {needed}: use a larger corpus or a smaller budget"
        )
