"""The checks of notebook 07's exercises."""

from __future__ import annotations

import torch

from .framework import Wrong, _exercise
from .helpers import _distinct, _fresh_generator, _given, _number, _prediction_credit, _tensor


def _little_endian(bits) -> int:
    return sum(int(bit) << i for i, bit in enumerate(bits))


def _addition_answer(a: int, b: int, length: int, end: int, *, big_endian=False, with_end=True, pad=0) -> list:
    """binary_addition's answer for a + b (little-endian bits without trailing zeros, END, then 0s), or one of
    its common wrong versions."""
    bits = [int(bit) for bit in format(a + b, "b")]
    answer = (bits if big_endian else bits[::-1]) + ([end] if with_end else [])
    return answer + [pad] * (length - len(answer))


@_exercise(
    "07",
    "implement",
    "a CHE task generator: binary_addition",
    (
        "a sample is two non-zero binary numbers, least significant bit first, with '+' (id 2) between them at "
        "a random place; its answer is their sum written the same way, then END (id 2), then padding 0s",
        "per row: draw where '+' goes, draw bits until both operands are non-zero, compute the sum as Python "
        "integers, and write its bits least significant first; every draw uses the generator you are given",
    ),
    points=3,
)
def addition_sample(your_function):
    from ...lab import tasks

    task = tasks.get_task("binary_addition")
    end = task.end_token
    generator = _fresh_generator()
    splits, seed_ignored = set(), False
    for seed, (batch, n) in zip(torch.randint(0, 2**31, (2,), generator=generator).tolist(), ((64, 7), (64, 20))):
        sample = _given(your_function, "addition_sample")(batch, n, torch.Generator().manual_seed(seed))
        if not (isinstance(sample, tuple) and len(sample) == 2):
            raise Wrong("addition_sample should return a pair (inputs, targets)")
        inputs, targets = (_tensor(t, name) for t, name in zip(sample, ("inputs", "targets")))
        if tuple(inputs.shape) != (batch, n):
            raise Wrong(f"inputs have shape {tuple(inputs.shape)}, not (batch_size, n) = {(batch, n)}")
        if tuple(targets.shape) != (batch, n + 1):
            raise Wrong(
                f"targets have shape {tuple(targets.shape)}, not (batch_size, n + 1) = {(batch, n + 1)}",
                hint="the answer has room for n + 1 tokens: the sum, END, then 0s",
            )
        if inputs.dtype != torch.long or targets.dtype != torch.long:
            raise Wrong("inputs and targets should be LongTensors (token ids)")
        if not ((0 <= inputs) & (inputs <= 2)).all():
            raise Wrong("inputs hold ids outside 0 ('0'), 1 ('1') and 2 ('+')")
        operators = (inputs == 2).sum(dim=1)
        if (operators != 1).any():
            raise Wrong(
                f"a row holds {int(operators[operators != 1][0])} operators; every row holds exactly one '+' (id 2)",
                hint="write the operator at the split position, after the first operand",
            )
        for row, target in zip(inputs.tolist(), targets.tolist()):
            split = row.index(2)
            splits.add(split)
            if not 1 <= split <= n - 2:
                raise Wrong(
                    f"a row has its operator at position {split}: both operands need at least one bit",
                    hint="draw the split from 1 .. n - 2",
                )
            a, b = _little_endian(row[:split]), _little_endian(row[split + 1 :])
            if a == 0 or b == 0:
                raise Wrong(
                    "a row has an operand equal to 0",
                    hint="each operand is a non-zero number: redraw a row whose operand bits are all 0",
                )
            if target == _addition_answer(a, b, n + 1, end):
                continue
            shown = f"{''.join('+' if t == 2 else str(t) for t in row)} -> {target}"
            mistakes = {
                "your sum is written big-endian": (
                    _addition_answer(a, b, n + 1, end, big_endian=True),
                    "write the sum little-endian: least significant bit first",
                ),
                "you read the operands big-endian": (
                    _addition_answer(
                        _little_endian(row[:split][::-1]), _little_endian(row[split + 1 :][::-1]), n + 1, end
                    ),
                    "bit i of an operand (in input order) is worth 2^i",
                ),
                "there is no END after the sum": (
                    _addition_answer(a, b, n + 1, end, with_end=False),
                    "end the answer with END (id 2), then pad with 0",
                ),
                "the padding after END is END again": (
                    _addition_answer(a, b, n + 1, end, pad=end),
                    "pad with 0 after the first END",
                ),
            }
            for description, (wrong, hint) in mistakes.items():
                if target == wrong:
                    raise Wrong(f"{shown}: {description}", hint=hint)
            raise Wrong(f"{shown}: the targets are not the sum of the two operands, little-endian, then END")
        again = _given(your_function, "addition_sample")(batch, n, torch.Generator().manual_seed(seed))
        if not torch.equal(_tensor(again[0], "inputs"), inputs):
            raise Wrong(
                "two calls with equally seeded generators gave different inputs: the sample does not come "
                "from the generator you are given",
                hint="pass generator=generator to every torch.randint",
            )
        other = _given(your_function, "addition_sample")(batch, n, torch.Generator().manual_seed(seed + 1))
        seed_ignored = seed_ignored or torch.equal(_tensor(other[0], "inputs"), inputs)  # 64 random rows
    if len(splits) < 4:
        raise Wrong(
            f"the operator sits only at positions {sorted(splits)}",
            hint="draw the split at random from 1 .. n - 2 for each row: the operands have random lengths",
        )
    if seed_ignored:
        raise Wrong(
            "two calls with generators seeded differently gave the same inputs: the sample does not come "
            "from the generator you are given (a sample kept from an earlier call?)",
            hint="pass generator=generator to every torch.randint",
        )


OUTPUT_LENGTH_TASKS = ("reverse_string", "duplicate_string", "compute_sqrt", "binary_multiplication", "parity_check")


@_exercise(
    "07",
    "derive",
    "the answer length of five tasks",
    (
        "what does each task compute, and how long can that answer be for an input of n tokens?",
        "for the numbers, count bits: try small inputs (n = 3, 4) and see how many bits the root or the "
        "product can need; a classification answers with one token",
    ),
    points=2,
)
def output_length(your_function):
    from ...lab import tasks

    generator = _fresh_generator()
    # lengths up to 10⁹: a table of answers cannot cover them, a formula does
    lengths = [3, 4] + torch.randint(5, 10**9, (4,), generator=generator).tolist()
    for name in OUTPUT_LENGTH_TASKS:
        task = tasks.get_task(name)
        for n in lengths:
            got = _given(your_function, "output_length")(name, n)
            want = task.output_length(n)
            if got == want:
                continue
            where = f"output_length({name!r}, {n}) = {got!r}"
            known = {
                ("compute_sqrt", n // 2): "try n = 3: how many bits has the square root of 7 (binary 111)?",
                ("binary_multiplication", n - 1): "count every token of the answer: it ends with END",
                ("duplicate_string", n): "the answer is the input twice",
                ("parity_check", n): "parity is a classification: how many tokens does its answer need?",
            }
            if (name, got) in known:
                raise Wrong(where, hint=known[name, got])
            raise Wrong(f"{where}, which is not the length of {name}'s answer")


@_exercise(
    "07",
    "implement",
    "per-token accuracy with the END mask",
    (
        "a row's answer ends at its first END, which is scored; the positions after it are padding",
        "mark which positions are scored, then pool the whole batch: its correct scored tokens over its scored tokens",
    ),
    points=2,
)
def masked_accuracy(your_function):
    from ...lab import tasks

    task = tasks.get_task("stack_manipulation")
    generator = _fresh_generator()
    for _ in range(100):  # inputs on which every known mistake gives another accuracy than the right one
        targets = torch.randint(0, task.output_vocab, (16, 9), generator=generator)
        targets[torch.arange(16), torch.randint(0, 9, (16,), generator=generator)] = task.end_token
        targets[0] = torch.randint(0, task.end_token, (9,), generator=generator)  # a row without END
        logits = torch.randn(16, 9, task.output_vocab, generator=generator)
        right = torch.rand(16, 9, 1, generator=generator) > 0.4  # about 60% right
        logits += 3 * torch.nn.functional.one_hot(targets, task.output_vocab) * right
        want = tasks.accuracy(logits, targets, task).item()
        correct = logits.argmax(-1) == targets
        is_end = (targets == task.end_token).int()
        before = (is_end.cumsum(1) - is_end) == 0  # no END strictly before
        through = is_end.cumsum(1) == 0  # no END up to here
        per_row = torch.stack([(correct[r] & before[r]).sum() / before[r].sum() for r in range(16)]).mean().item()
        mistakes = {
            "you score every position, padding after END too": (
                correct.float().mean().item(),
                "mask the positions after the first END",
            ),
            "you leave out the END token itself": (
                ((correct & through).sum() / through.sum()).item(),
                "the first END is scored: count END strictly before t",
            ),
            "you average the rows' accuracies instead of pooling the scored tokens": (
                per_row,
                "divide the batch's correct scored tokens by the batch's scored tokens",
            ),
        }
        if all(abs(value - want) > 1e-6 for value, _ in mistakes.values()):
            break
    got = _number(
        _given(your_function, "masked_accuracy")(logits.clone(), targets.clone(), task.end_token),
        "masked_accuracy(logits, targets, end_token)",
    )
    if abs(got - want) <= 1e-6:
        return
    for description, (value, hint) in mistakes.items():
        if abs(got - value) <= 1e-6:
            raise Wrong(f"your accuracy is {got:.4f}: {description}", hint=hint)
    yours, theirs = _distinct(got, want, digits=4)
    raise Wrong(f"your accuracy is {yours}; md.tasks.accuracy gives {theirs}")


SHUFFLE_CASES = {
    "none, encoder": ("none", False),
    "none, decoder": ("none", True),
    "alibi, encoder": ("alibi", False),
    "rope, encoder": ("rope", False),
}


def _shuffle_unchanged(pe: str, causal: bool, seed: int = 0) -> bool:
    """Whether an untrained model's answer logits stay the same when the input part of parity_check is shuffled."""
    import dataclasses

    from ...lab import che, tasks
    from ...model import GPT, GPTConfig

    task = tasks.get_task("parity_check")
    inputs, _ = task.sample(4, 30, torch.Generator().manual_seed(seed + 2))
    shuffled = inputs[:, torch.randperm(30, generator=torch.Generator().manual_seed(seed + 3))]
    cfg = che.task_config(task, GPTConfig(pe=pe, n_layer=2, n_embd=64, n_head=4))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(dataclasses.replace(cfg, causal=causal)).eval()
    with torch.no_grad():
        before = model(tasks.encoder_inputs(inputs, task))[0][:, -1]
        after = model(tasks.encoder_inputs(shuffled, task))[0][:, -1]
    return torch.allclose(before, after, atol=1e-5)


@_exercise(
    "07",
    "experiment",
    "predict, then measure, which models cannot see the order of the input",
    (
        "attention without positions cannot see order: only a mask or a positional encoding can tell a "
        "shuffled input from the original",
        "measure every case of SHUFFLE_CASES with answer_unchanged, passing the case's encoding and causality",
    ),
    points=2,
)
def shuffle_invariance(prediction, measured):
    for value, what in ((prediction, "unchanged_prediction (your prediction)"), (measured, "unchanged_measured")):
        _given(value, what)
        if (
            not isinstance(value, dict)
            or set(value) != set(SHUFFLE_CASES)
            or not all(isinstance(v, bool) for v in value.values())
        ):
            raise Wrong(f"{what} should map each of {list(SHUFFLE_CASES)} to True or False, got {value!r}")
    want = {case: _shuffle_unchanged(pe, causal) for case, (pe, causal) in SHUFFLE_CASES.items()}
    if measured != want:
        raise Wrong(
            f"your measurement {measured} is not what the models do",
            hint="measure every case of SHUFFLE_CASES with answer_unchanged",
        )
    wrong = [case for case in want if prediction[case] != want[case]]
    return _prediction_credit(
        2,
        not wrong,
        "unchanged by shuffling: "
        + ", ".join(case for case, same in want.items() if same)
        + (f"; you predicted wrongly for {', '.join(wrong)}" if wrong else ""),
    )
