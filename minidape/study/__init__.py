r"""The papers' claims tested with seeds and statistics (`reproduce`), and any bias put through the same
protocol (`compare`).

```python
import minidape as md
from minidape.study import compare, reproduce
reproduce(budget="small", out="runs/reproduce-small")          # claims C1-C6 -> REPRODUCTION.md, figures
compare("my_bias", against=("alibi", "kerple_log"))            # a registered bias against the baselines, 5 seeds
compare("my_bias.py:MyBias+conv:5", out="runs/compare/my_bias")  # a class in a file, with DAPE-V2's 1x5 refiner
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
``OUT/runs/``, recording the corpus's sha256 and size and the run's full configuration (`runs.run_record`); a
restart reuses a file only when both match and refuses one that does not, naming it and what differs (or trains
it again when asked: ``rerun``), so results of two corpora or budgets never mix. Two corpus files of one name
in two folders are two corpora. `reproduce` also refuses other settings into the same ``OUT`` as a whole
(``OUT/manifest.json`` records them). The same command started twice (two terminals) shares the runs between
the two processes.
On a cluster, ``step=`` (``--list-runs``, ``--run N``, ``--report``) splits either command into its runs for
the scheduler one already has (README: "The study on a cluster").

`compare`'s endpoints and REPRODUCTION.md's statements are one code (`endpoints.log_ratio_units`): a model
against another at the training length, beyond it or over all lengths, and a model's degradation from the
training length to 16x, judged with an equivalence test (TOST) for "stays within 10 %".

One job per module, each importing only those above it:

- `claims`: the models (label -> `GPTConfig` overrides) and the claims C1-C6 as statements; C4's leaky refiner.
- `budgets`: model size, training and evaluation of every run (`BUDGETS`), and the configs they build.
- `statistics`: endpoints, intervals and tests, Holm's adjustment, the verdict rule.
- `runs`: one run trained and evaluated, its JSON file and record, the folder's manifest, progress lines.
- `endpoints`: where each statement is tested, its endpoint per unit, `judge`.
- `figures`, `report`: the figures and REPRODUCTION.md / results.json.
- `reproduction`: `reproduce`; `comparison`: `compare`, its model syntax (`parse_model`) and endpoints;
  `demo`: `python -m minidape demo`.
"""

from .budgets import (
    BUDGET_NAMES,
    BUDGETS,
    CHE_MAX_TRAIN_LENGTH,
    CUDA_OVERRIDES,
    DEFAULT_CORPORA,
    DEFAULT_SEEDS,
    Budget,
    matched_dape_width,
    resolve_budget,
)
from .claims import (
    CHE_MODELS,
    CHE_TASKS,
    CLAIMS,
    FLAT_MARGIN,
    KINDS,
    LEAKY_REFINER,
    LEARNED_MARGIN,
    MATCHED_WIDTH,
    MODELS,
    NEAR_MARGIN,
    NOT_TESTED,
    SCOPES,
    UNIGRAM_SHARE,
    Claim,
    ConvRefinerWithoutTril,
    Statement,
    register_leaky_refiner,
)
from .comparison import DEFAULT_BASELINES, compare, compare_endpoints, parse_model, resolve_pe
from .endpoints import judge, log_ratio_units, statement_cells, statement_units, study_plan, unlearned_tasks
from .figures import plot_bands
from .report import unigram_perplexity, write_report
from .reproduction import collect_results, reproduce
from .runs import Progress, che_train_and_evaluate, check_settings, train_and_evaluate
from .statistics import ALPHA, VERDICT_RULE, Cell, Endpoint, claim_verdict, format_mean_std, holm, mean_std, verdict

__all__ = [
    "ALPHA",
    "BUDGETS",
    "BUDGET_NAMES",
    "CHE_MAX_TRAIN_LENGTH",
    "CHE_MODELS",
    "CHE_TASKS",
    "CLAIMS",
    "CUDA_OVERRIDES",
    "DEFAULT_BASELINES",
    "DEFAULT_CORPORA",
    "DEFAULT_SEEDS",
    "FLAT_MARGIN",
    "KINDS",
    "LEAKY_REFINER",
    "LEARNED_MARGIN",
    "MATCHED_WIDTH",
    "MODELS",
    "NEAR_MARGIN",
    "NOT_TESTED",
    "SCOPES",
    "UNIGRAM_SHARE",
    "VERDICT_RULE",
    "Budget",
    "Cell",
    "Claim",
    "ConvRefinerWithoutTril",
    "Endpoint",
    "Progress",
    "Statement",
    "che_train_and_evaluate",
    "check_settings",
    "claim_verdict",
    "collect_results",
    "compare",
    "compare_endpoints",
    "format_mean_std",
    "holm",
    "judge",
    "log_ratio_units",
    "matched_dape_width",
    "mean_std",
    "parse_model",
    "plot_bands",
    "register_leaky_refiner",
    "reproduce",
    "resolve_budget",
    "resolve_pe",
    "statement_cells",
    "statement_units",
    "study_plan",
    "train_and_evaluate",
    "unigram_perplexity",
    "unlearned_tasks",
    "verdict",
    "write_report",
]
