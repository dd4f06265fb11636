"""Chomsky-hierarchy task generators: every label re-derived by an independent check (Python ints, eval, simulation)."""

import math
import random

import numpy as np
import pytest
import torch

from minidape import tasks

EXPECTED_LEVELS = {  # Delétang et al. 2023, Table 2 (R / DCF / CS)
    "even_pairs": "regular",
    "modular_arithmetic": "regular",
    "parity_check": "regular",
    "cycle_navigation": "regular",
    "stack_manipulation": "context-free",
    "reverse_string": "context-free",
    "modular_arithmetic_brackets": "context-free",
    "solve_equation": "context-free",
    "duplicate_string": "context-sensitive",
    "missing_duplicate_string": "context-sensitive",
    "odds_first": "context-sensitive",
    "binary_addition": "context-sensitive",
    "binary_multiplication": "context-sensitive",
    "compute_sqrt": "context-sensitive",
    "bucket_sort": "context-sensitive",
}
LENGTHS = (1, 2, 3, 4, 5, 6, 7, 17, 40, 41)


def draw(name, n, batch_size=64, seed=0):
    task = tasks.get_task(name)
    inputs, targets = task.sample(batch_size, n, torch.Generator().manual_seed(seed))
    return task, inputs.tolist(), targets.tolist()


def valid_lengths(name, lengths=LENGTHS):
    task = tasks.get_task(name)
    return [n for n in lengths if task.is_valid_length(n)]


def decode(task, row):
    return "".join(task.input_symbols[i] for i in row)


def little_endian_int(bits):
    return sum(bit << i for i, bit in enumerate(bits))


# ------------------------------------------------------------------------------------------------ registry


def test_names_and_levels():
    assert set(tasks.TASK_NAMES) == set(EXPECTED_LEVELS) and len(tasks.TASK_NAMES) == 15
    for name in tasks.TASK_NAMES:
        task = tasks.get_task(name)
        assert task.name == name and task.level == EXPECTED_LEVELS[name]
        assert type(task).__doc__


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError, match="unknown task 'evenpairs'.*even_pairs.*bucket_sort"):
        tasks.get_task("evenpairs")


# ------------------------------------------------------------------------------------------ shapes, errors


@pytest.mark.parametrize("name", tasks.TASK_NAMES)
def test_shapes_and_vocab_ranges(name):
    task = tasks.get_task(name)
    generator = torch.Generator().manual_seed(1)
    for requested in (1, 2, 40, 500):
        if requested < task.min_length:
            with pytest.raises(ValueError, match=str(requested)):
                task.sample(4, requested, generator)
            continue
        n = task.valid_length(requested)
        if n != requested:
            with pytest.raises(ValueError, match=f"length {requested}"):
                task.sample(4, requested, generator)
        inputs, targets = task.sample(8, n, generator)
        assert inputs.dtype == targets.dtype == torch.long
        assert inputs.shape == (8, n) and targets.shape == (8, task.output_length(n))
        assert 0 <= inputs.min() and inputs.max() < task.input_vocab
        assert 0 <= targets.min() and targets.max() < task.output_vocab


def test_length_rules():
    arithmetic = tasks.get_task("modular_arithmetic")
    assert [arithmetic.valid_length(n) for n in (1, 2, 40, 41)] == [1, 1, 39, 41]
    with pytest.raises(ValueError, match="odd"):
        arithmetic.sample(2, 40, torch.Generator())
    for name, shortest in (
        ("binary_addition", 3),
        ("binary_multiplication", 3),
        ("solve_equation", 3),
        ("missing_duplicate_string", 2),
    ):
        task = tasks.get_task(name)
        assert task.min_length == shortest and task.valid_length(shortest) == shortest
        with pytest.raises(ValueError, match=name):
            task.valid_length(shortest - 1)


@pytest.mark.parametrize("bad_n, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)])
def test_bad_lengths(bad_n, error):
    with pytest.raises(error, match="n must"):
        tasks.get_task("reverse_string").sample(2, bad_n, torch.Generator())


def test_bad_batch_size_and_generator():
    task = tasks.get_task("parity_check")
    with pytest.raises(ValueError, match="batch_size"):
        task.sample(0, 5, torch.Generator())
    with pytest.raises(TypeError, match="torch.Generator"):
        task.sample(2, 5, 123)


# ------------------------------------------------------------------------------------- labels, regular


@pytest.mark.parametrize("n", LENGTHS)
def test_even_pairs(n):
    _, inputs, targets = draw("even_pairs", n)
    for row, (label,) in zip(inputs, targets):
        assert label == sum(row[i] != row[i + 1] for i in range(n - 1)) % 2


@pytest.mark.parametrize("n", LENGTHS)
def test_parity_check(n):
    _, inputs, targets = draw("parity_check", n)
    for row, (label,) in zip(inputs, targets):
        assert label == row.count(1) % 2


@pytest.mark.parametrize("n", LENGTHS)
def test_cycle_navigation(n):
    _, inputs, targets = draw("cycle_navigation", n)
    for row, (label,) in zip(inputs, targets):
        position = 0
        for move in row:
            position = (position + {0: -1, 1: 0, 2: 1}[move]) % 5
        assert label == position


@pytest.mark.parametrize("n", [1, 3, 5, 7, 41, 499])
def test_modular_arithmetic(n):
    task, inputs, targets = draw("modular_arithmetic", n)
    for row, (label,) in zip(inputs, targets):
        expression = decode(task, row)
        assert all(c.isdigit() for c in expression[::2]) and all(c in "+-*" for c in expression[1::2])
        assert label == eval(expression) % 5  # Python's precedence: * before + and -


# ------------------------------------------------------------------------------------ labels, context-free


@pytest.mark.parametrize("n", LENGTHS)
def test_stack_manipulation(n):
    task, inputs, targets = draw("stack_manipulation", n)
    pop, push0, push1 = (task.input_symbols.index(s) for s in ("POP", "PUSH0", "PUSH1"))
    for row, target in zip(inputs, targets):
        initial = 0
        while initial < n and row[initial] in (0, 1):
            initial += 1
        assert 1 <= initial and (initial < n or n == 1)  # a non-empty initial stack, then >= 1 action
        stack = list(row[:initial])
        for action in row[initial:]:
            if action == pop:
                if stack:
                    stack.pop()
            else:
                stack.append({push0: 0, push1: 1}[action])
        expected = stack[::-1] + [task.end_token]
        assert target == expected + [0] * (n + 1 - len(expected))


@pytest.mark.parametrize("n", LENGTHS)
def test_reverse_string(n):
    _, inputs, targets = draw("reverse_string", n)
    for row, target in zip(inputs, targets):
        assert target == [row[n - 1 - i] for i in range(n)]


def check_bracket_expression(expression):
    depth = 0
    for c in expression:
        depth += {"(": 1, ")": -1}.get(c, 0)
        assert depth >= 0
    assert depth == 0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 9, 40, 41, 200])
def test_modular_arithmetic_brackets(n):
    task, inputs, targets = draw("modular_arithmetic_brackets", n, batch_size=32)
    for row, (label,) in zip(inputs, targets):
        expression = decode(task, row)
        check_bracket_expression(expression)
        assert label == eval(expression) % 5
    if n >= 5:  # all three operators appear over the batch
        assert {"+", "-", "*"} <= set("".join(decode(task, row) for row in inputs))


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 9, 40, 41, 200])
def test_solve_equation(n):
    task, inputs, targets = draw("solve_equation", n, batch_size=32)
    for row, (label,) in zip(inputs, targets):
        equation = decode(task, row)
        left, right = equation.split("=")
        assert left.count("x") == 1 and "*" not in left and right in "01234" and len(right) == 1
        check_bracket_expression(left)
        solutions = [c for c in range(5) if eval(left.replace("x", str(c))) % 5 == int(right)]
        assert solutions == [label]


# ------------------------------------------------------------------------------- labels, context-sensitive


@pytest.mark.parametrize("n", LENGTHS)
def test_duplicate_string(n):
    _, inputs, targets = draw("duplicate_string", n)
    for row, target in zip(inputs, targets):
        assert len(target) == 2 * n and target[:n] == row and target[n:] == row


@pytest.mark.parametrize("n", [2, 3, 4, 5, 40, 41])
def test_missing_duplicate_string(n):
    task, inputs, targets = draw("missing_duplicate_string", n)
    missing, pad = task.input_symbols.index("?"), task.input_symbols.index("_")
    hidden_positions = set()
    for row, (label,) in zip(inputs, targets):
        if n % 2:
            assert row[-1] == pad
            row = row[:-1]
        assert row.count(missing) == 1 and pad not in row
        hidden_positions.add(row.index(missing))
        restored = [label if symbol == missing else symbol for symbol in row]
        assert restored[: n // 2] == restored[n // 2 :]
    if n >= 40:  # the hole is drawn from both copies
        assert min(hidden_positions) < n // 2 <= max(hidden_positions)


@pytest.mark.parametrize("n", LENGTHS)
def test_odds_first(n):
    _, inputs, targets = draw("odds_first", n)
    for row, target in zip(inputs, targets):
        odd_positions = [row[i] for i in range(n) if i % 2 == 1]
        even_positions = [row[i] for i in range(n) if i % 2 == 0]
        assert target == odd_positions + even_positions


@pytest.mark.parametrize(
    "name, operation", [("binary_addition", lambda a, b: a + b), ("binary_multiplication", lambda a, b: a * b)]
)
@pytest.mark.parametrize("n", [3, 4, 5, 7, 40, 41, 500])
def test_binary_arithmetic(name, operation, n):
    task, inputs, targets = draw(name, n)
    operator = task.input_symbols.index("+" if name == "binary_addition" else "*")
    for row, target in zip(inputs, targets):
        assert row.count(operator) == 1
        split = row.index(operator)
        a, b = little_endian_int(row[:split]), little_endian_int(row[split + 1 :])
        assert a >= 1 and b >= 1
        result_bits = [int(c) for c in reversed(bin(operation(a, b))[2:])]
        expected = result_bits + [task.end_token]
        assert target == expected + [0] * (task.output_length(n) - len(expected))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 40, 41, 500])
def test_compute_sqrt(n):
    _, inputs, targets = draw("compute_sqrt", n)
    for row, target in zip(inputs, targets):
        value = int("".join(map(str, row)), 2)
        assert value >= 1
        assert "".join(map(str, target)) == format(math.isqrt(value), "b").zfill(math.ceil(n / 2))


@pytest.mark.parametrize("n", LENGTHS)
def test_bucket_sort(n):
    _, inputs, targets = draw("bucket_sort", n)
    for row, target in zip(inputs, targets):
        assert target == sorted(row)


# ------------------------------------------------------------------------------------------------ seeding


@pytest.mark.parametrize("name", tasks.TASK_NAMES)
def test_seeded_by_the_generator_only(name):
    n = tasks.get_task(name).valid_length(41)
    global_states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    _, inputs, targets = draw(name, n, batch_size=16, seed=7)
    _, inputs_again, targets_again = draw(name, n, batch_size=16, seed=7)
    _, inputs_other, targets_other = draw(name, n, batch_size=16, seed=8)
    assert (inputs, targets) == (inputs_again, targets_again)
    assert inputs != inputs_other
    assert torch.equal(torch.get_rng_state(), global_states[0]) and random.getstate() == global_states[1]
    assert np.array_equal(np.random.get_state()[1], global_states[2])


@pytest.mark.parametrize("name", tasks.TASK_NAMES)
def test_batches_at_the_longest_test_length(name):
    """Length 500, the longest the papers test, samples whole batches (no recursion limit, no per-row fallback
    that changes the answer format) with the shapes and classes of the short ones."""
    task = tasks.get_task(name)
    n = task.valid_length(500)
    inputs, targets = task.sample(16, n, torch.Generator().manual_seed(0))
    assert inputs.shape == (16, n) and targets.shape == (16, task.output_length(n))
    assert 0 <= inputs.min() and inputs.max() < task.input_vocab
    assert 0 <= targets.min() and targets.max() < task.output_vocab


# ---------------------------------------------------------------------------------------------- accuracy


def one_hot_logits(predictions, classes):
    return torch.nn.functional.one_hot(torch.tensor(predictions), classes).float()


def test_accuracy_stops_after_the_end_token():
    task = tasks.get_task("stack_manipulation")
    end = task.end_token
    targets = torch.tensor([[1, 0, end, 0, 0], [end, 0, 0, 0, 0]])
    # Row 0: one mistake before the end token, garbage after it; row 1: right end token, garbage after it.
    predictions = [[1, 1, end, 1, end], [end, 1, end, 1, 1]]
    logits = one_hot_logits(predictions, task.output_vocab)
    mask = tasks.output_mask(targets, task)
    assert mask.tolist() == [[True, True, True, False, False], [True, False, False, False, False]]
    assert tasks.accuracy(logits, targets, task).item() == pytest.approx(3 / 4)
    assert tasks.accuracy(logits, targets, task, per_sample=True).tolist() == pytest.approx([2 / 3, 1.0])
    # A wrong end token counts as a mistake.
    predictions[1][0] = 0
    assert tasks.accuracy(one_hot_logits(predictions, task.output_vocab), targets, task).item() == pytest.approx(2 / 4)


def test_accuracy_counts_every_position_without_end_token():
    task = tasks.get_task("reverse_string")
    targets = torch.tensor([[0, 1, 1, 0]])
    assert torch.equal(tasks.output_mask(targets, task), torch.ones(1, 4, dtype=torch.bool))
    logits = one_hot_logits([[0, 1, 1, 1]], 2)
    assert tasks.accuracy(logits, targets, task).item() == pytest.approx(3 / 4)


def test_accuracy_reads_only_the_answer_classes():
    task = tasks.get_task("binary_addition")
    targets = torch.tensor([[1, 1, task.end_token, 0]])
    logits = one_hot_logits([[1, 1, task.end_token, 0]], task.model_vocab_size + 3)
    logits[..., task.output_vocab :] = 100.0  # extra (non-answer) classes must be ignored
    assert tasks.accuracy(logits, targets, task).item() == 1.0
    with pytest.raises(ValueError, match="logits must be"):
        tasks.accuracy(logits[:, :3], targets, task)
    with pytest.raises(ValueError, match="logits must be"):
        tasks.accuracy(logits[..., :2], targets, task)


def test_mask_of_sampled_additions_covers_sum_and_end_token():
    task, inputs, targets = draw("binary_addition", 30, batch_size=16)
    mask = tasks.output_mask(torch.tensor(targets), task)
    for row, row_mask in zip(inputs, mask.tolist()):
        split = row.index(2)
        total = little_endian_int(row[:split]) + little_endian_int(row[split + 1 :])
        assert sum(row_mask) == total.bit_length() + 1 and row_mask[0]


# ------------------------------------------------------------------------------------------ encoder setup


@pytest.mark.parametrize("name", ["cycle_navigation", "duplicate_string", "binary_multiplication"])
def test_encoder_inputs_and_targets(name):
    task = tasks.get_task(name)
    inputs, targets = task.sample(4, 9, torch.Generator().manual_seed(0))
    sequence = tasks.encoder_inputs(inputs, task)
    answer_length = task.output_length(9)
    assert sequence.shape == (4, 9 + answer_length)
    assert torch.equal(sequence[:, :9], inputs) and (sequence[:, 9:] == task.input_vocab).all()
    assert task.model_vocab_size > sequence.max() and task.model_vocab_size >= task.output_vocab
    labels = tasks.encoder_targets(targets, 9)
    assert (labels[:, :9] == -1).all() and torch.equal(labels[:, 9:], targets)


def test_chance_accuracy():
    chances = {name: tasks.get_task(name).chance_accuracy for name in tasks.TASK_NAMES}
    assert chances["parity_check"] == chances["reverse_string"] == 0.5
    assert chances["bucket_sort"] == chances["cycle_navigation"] == chances["solve_equation"] == pytest.approx(0.2)
    # The end token is not an answer symbol: stack and binary answers are bits, chance 1/2.
    assert chances["stack_manipulation"] == chances["binary_addition"] == 0.5
