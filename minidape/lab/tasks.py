"""Chomsky-hierarchy length-generalisation tasks (CHE; Delétang et al. 2023).

The 15 tasks of the benchmark, generated the way the authors' generators do (alphabets, output lengths,
sampling distributions), as PyTorch ``LongTensor``s of class ids::

    task = get_task("reverse_string")
    g = torch.Generator().manual_seed(0)
    inputs, targets = task.sample(batch_size=32, n=40, generator=g)   # (32, 40), (32, 40)
    acc = accuracy(logits, targets, task)                               # logits (32, 40, >= output_vocab)

Conventions shared by every task:

- ``sample`` draws every random number from the ``generator`` it is given; nothing touches a global RNG,
  so a seeded generator reproduces a batch exactly.
- Tasks with a variable-length answer (``stack_manipulation``, ``binary_addition``,
  ``binary_multiplication``) end the answer with ``task.end_token`` and pad with class 0; ``accuracy``
  scores positions up to and including the first end token, as the benchmark does.
- Some lengths cannot be produced (``modular_arithmetic`` needs odd lengths, binary arithmetic and
  ``solve_equation`` need room for two operands). ``sample`` rejects them with a ``ValueError``;
  ``task.valid_length(n)`` maps a requested length to the one the original code generates (it silently
  used ``n - 1`` for even ``modular_arithmetic`` lengths) and ``task.min_length`` is the shortest valid
  length. A training loop drawing ``n ~ U{1..40}`` should draw from ``U{task.min_length..40}`` and pass
  it through ``task.valid_length``.

Encoder setup (Ruoss et al. 2023): the model reads the input followed by ``output_length(n)`` placeholder
tokens with id ``task.input_vocab`` (:func:`encoder_inputs`) and answers at those positions, so its
vocabulary is ``task.model_vocab_size`` (``input_vocab + 1``, or ``output_vocab`` if larger: the model's
classifier must cover the answer classes too). :func:`encoder_targets` prepends ignore labels (-1) for the
input positions so the model's own cross-entropy trains on the answer positions only.

This module only generates and scores (torch only); training and testing an encoder on a task, the
protocol of the DAPE papers, is :mod:`minidape.lab.che`.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "TASK_NAMES",
    "LEVELS",
    "Task",
    "get_task",
    "accuracy",
    "output_mask",
    "encoder_inputs",
    "encoder_targets",
]

MODULUS = 5  # modulus of the arithmetic tasks and length of the cycle, as in the benchmark
LEVELS = ("regular", "context-free", "context-sensitive")
_DIGITS = tuple(str(d) for d in range(MODULUS))


def _check_positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return value


def _rand_bits(shape, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=generator)


def _resample_zero_rows(bits: torch.Tensor, groups: list[torch.Tensor], generator: torch.Generator) -> torch.Tensor:
    """Redraw whole rows of ``bits`` until every group (a bool mask over positions) holds at least one 1.

    This draws each group's binary number uniformly from ``{1, ..., 2^len - 1}``, as the original does.
    """
    while True:
        bad = torch.zeros(bits.shape[0], dtype=torch.bool)
        for group in groups:
            bad |= ~(bits.bool() & group).any(dim=1)
        if not bad.any():
            return bits
        bits[bad] = _rand_bits((int(bad.sum()), bits.shape[1]), generator)


def _bits_to_int(bits: list[int]) -> int:
    """Big-endian bit list -> int."""
    return int("".join(map(str, bits)), 2)


def _int_to_bits(value: int) -> list[int]:
    """int -> big-endian bit list without leading zeros (``[0]`` for zero)."""
    return [int(bit) for bit in format(value, "b")]


class _UniformStream:
    """Integer draws for per-sample Python generators, taken in chunks from a ``torch.Generator``."""

    def __init__(self, generator: torch.Generator, chunk: int = 4096):
        self._generator, self._chunk = generator, chunk
        self._values: list[float] = []
        self._next = 0

    def below(self, k: int) -> int:
        """A uniform integer in ``[0, k)``."""
        if self._next == len(self._values):
            self._values = torch.rand(self._chunk, dtype=torch.float64, generator=self._generator).tolist()
            self._next = 0
        u = self._values[self._next]
        self._next += 1
        return min(int(u * k), k - 1)


class Task:
    """A CHE task: an input alphabet, an answer alphabet, a length rule and a sampler.

    Subclasses set ``name``, ``level``, ``input_symbols``, ``output_symbols`` (printable names of the class
    ids, id = index), optionally ``end_token``/``min_length``/``output_length``/``is_valid_length``, and
    implement ``_sample(batch_size, n, generator)``.
    """

    name: str = ""
    level: str = ""
    input_symbols: tuple[str, ...] = ()
    output_symbols: tuple[str, ...] = ()
    end_token: int | None = None
    min_length: int = 1
    length_rule: str = "any length >= 1"

    @property
    def input_vocab(self) -> int:
        return len(self.input_symbols)

    @property
    def output_vocab(self) -> int:
        return len(self.output_symbols)

    @property
    def placeholder_token(self) -> int:
        """Input id of the answer placeholders appended by :func:`encoder_inputs`."""
        return self.input_vocab

    @property
    def chance_accuracy(self) -> float:
        """Accuracy of uniform guessing among the answer symbols (the end token is not one of them): the
        "random accuracy" of the DAPE paper's Table 2 (50% for binary answers, 20% for mod-5 ones)."""
        return 1.0 / (self.output_vocab - (self.end_token is not None))

    @property
    def model_vocab_size(self) -> int:
        """Vocabulary of an encoder model: inputs, the placeholder, and every answer class."""
        return max(self.input_vocab + 1, self.output_vocab)

    def output_length(self, n: int) -> int:
        """Number of answer positions for an input of length ``n``."""
        _check_positive_int(n, "n")
        return 1

    def is_valid_length(self, n: int) -> bool:
        return n >= self.min_length

    def valid_length(self, n: int) -> int:
        """The largest valid length ``<= n``: the length the original generator uses when asked for ``n``."""
        _check_positive_int(n, "n")
        if n < self.min_length:
            raise ValueError(f"{self.name} has no input length <= {n}: it needs {self.length_rule}")
        while not self.is_valid_length(n):
            n -= 1
        return n

    def sample(self, batch_size: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``(inputs (B, n), targets (B, output_length(n)))`` LongTensors of class ids."""
        _check_positive_int(batch_size, "batch_size")
        _check_positive_int(n, "n")
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator (seeded by you), got {type(generator).__name__}")
        if not self.is_valid_length(n):
            raise ValueError(
                f"{self.name} cannot produce inputs of length {n}: it needs {self.length_rule} "
                f"(task.valid_length({n}) gives the length the original benchmark would use)"
            )
        return self._sample(batch_size, n, generator)

    def _sample(self, batch_size: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, level={self.level!r}, input_vocab={self.input_vocab}, "
            f"output_vocab={self.output_vocab}, end_token={self.end_token})"
        )


# ---------------------------------------------------------------------------------------------- regular


class EvenPairs(Task):
    """Binary string; class 1 iff the number of unequal neighbours ("01" or "10") is odd.

    That count is odd exactly when the first and last symbols differ, which is how it is computed.
    """

    name, level = "even_pairs", "regular"
    input_symbols, output_symbols = ("0", "1"), ("even", "odd")

    def _sample(self, batch_size, n, generator):
        strings = _rand_bits((batch_size, n), generator)
        return strings, (strings[:, :1] != strings[:, -1:]).long()


class ModularArithmetic(Task):
    r"""``d op d op ... d`` with digits in ``{0..4}`` and ops ``+ - *``; the value mod 5.

    Usual precedence: ``*`` binds tighter than ``+``/``-``, all left-associative, e.g.
    ``1 - 2 * 3 + 4 = 1 - 6 + 4 = -1 \equiv 4``. Lengths are odd; the original turned an even request
    ``n`` into ``n - 1`` (see ``valid_length``), here an even ``n`` is an error. Input ids: digits 0-4,
    then ``+ - *``; the original also reserved a never-sampled blank symbol, left out here.
    """

    name, level = "modular_arithmetic", "regular"
    input_symbols, output_symbols = _DIGITS + ("+", "-", "*"), _DIGITS
    length_rule = "an odd length"
    PLUS, MINUS, TIMES = MODULUS, MODULUS + 1, MODULUS + 2

    def is_valid_length(self, n):
        return n % 2 == 1

    def _sample(self, batch_size, n, generator):
        digits = torch.randint(0, MODULUS, (batch_size, n // 2 + 1), generator=generator)
        ops = torch.randint(self.PLUS, self.TIMES + 1, (batch_size, n // 2), generator=generator)
        inputs = torch.empty(batch_size, n, dtype=torch.long)
        inputs[:, 0::2], inputs[:, 1::2] = digits, ops
        # Left to right: `term` is the running product of the current additive term (sign included),
        # `total` the sum of the finished terms.
        total = torch.zeros(batch_size, dtype=torch.long)
        term = digits[:, 0]
        for j in range(ops.shape[1]):
            op, digit = ops[:, j], digits[:, j + 1]
            multiply = op == self.TIMES
            total = torch.where(multiply, total, total + term)
            term = torch.where(multiply, term * digit, torch.where(op == self.MINUS, -digit, digit)) % MODULUS
        return inputs, ((total + term) % MODULUS)[:, None]


class ParityCheck(Task):
    """Binary string; class = number of 1s mod 2."""

    name, level = "parity_check", "regular"
    input_symbols, output_symbols = ("0", "1"), ("even", "odd")

    def _sample(self, batch_size, n, generator):
        strings = _rand_bits((batch_size, n), generator)
        return strings, strings.sum(dim=1, keepdim=True) % 2


class CycleNavigation(Task):
    """Moves on a cycle of 5 states starting at 0: ids 0, 1, 2 step by -1, 0, +1; class = final state."""

    name, level = "cycle_navigation", "regular"
    input_symbols, output_symbols = ("-1", "0", "+1"), _DIGITS

    def _sample(self, batch_size, n, generator):
        moves = torch.randint(0, 3, (batch_size, n), generator=generator)
        return moves, (moves - 1).sum(dim=1, keepdim=True) % MODULUS


# ---------------------------------------------------------------------------------- (deterministic) context-free


class StackManipulation(Task):
    """An initial stack (bottom to top) of 0/1 followed by actions POP, PUSH0, PUSH1; output the final stack.

    The initial stack has length ``U{1..n-1}`` (all ``n`` symbols for ``n = 1``), the rest are uniform
    actions; POP on an empty stack is ignored. The answer (length ``n + 1``) is the final stack read
    top to bottom, then the end token 2, then 0s.
    """

    name, level = "stack_manipulation", "context-free"
    input_symbols, output_symbols = ("0", "1", "POP", "PUSH0", "PUSH1"), ("0", "1", "END")
    end_token = 2
    POP, PUSH0 = 2, 3

    def output_length(self, n):
        return _check_positive_int(n, "n") + 1

    def _sample(self, batch_size, n, generator):
        stack_length = (
            torch.randint(1, n, (batch_size, 1), generator=generator)
            if n > 1
            else torch.ones(batch_size, 1, dtype=torch.long)
        )
        symbols = _rand_bits((batch_size, n), generator)
        actions = torch.randint(self.POP, self.POP + 3, (batch_size, n), generator=generator)
        inputs = torch.where(torch.arange(n) < stack_length, symbols, actions)

        # Run every row's stack at once: an initial symbol or a PUSH writes at `height`, a POP lowers it.
        stack = torch.zeros(batch_size, n, dtype=torch.long)
        height = torch.zeros(batch_size, dtype=torch.long)
        for token in inputs.T:
            is_pop = token == self.POP
            # A POP writes into the free slot above the top, which is never read.
            stack.scatter_(1, height[:, None], torch.where(token >= self.PUSH0, token - self.PUSH0, token)[:, None])
            height = torch.where(is_pop, (height - 1).clamp(min=0), height + 1)

        positions = torch.arange(n + 1)
        top_first = stack.gather(1, (height[:, None] - 1 - positions).clamp(0, n - 1))
        height = height[:, None]
        targets = torch.where(positions < height, top_first, torch.where(positions == height, self.end_token, 0))
        return inputs, targets


class ReverseString(Task):
    """Binary string; the answer is the string reversed."""

    name, level = "reverse_string", "context-free"
    input_symbols, output_symbols = ("0", "1"), ("0", "1")

    def output_length(self, n):
        return _check_positive_int(n, "n")

    def _sample(self, batch_size, n, generator):
        strings = _rand_bits((batch_size, n), generator)
        return strings, strings.flip(1)


def _random_bracket_expression(
    length: int, operators: tuple[int, ...], ids: dict[str, int], stream: _UniformStream
) -> tuple[list[int], int]:
    """A random expression of exactly ``length`` tokens over ``{0..4}`` and its value mod 5.

    The grammar of the original generator: length 1 ``d``, 2 ``-d``, 3 ``(d)``, 4 ``(-d)``; longer:
    ``(L op R)`` with ``len(L) ~ U{1..length-4}``, ``len(R) = length - 3 - len(L)`` and a uniform operator.
    Built with an explicit work stack (depth grows like length/4, too deep for recursion at long lengths).
    """
    tokens: list[int] = []
    values: list[int] = []
    work: list[tuple[str, int]] = [("expr", length)]
    while work:
        kind, arg = work.pop()
        if kind == "token":
            tokens.append(arg)
        elif kind == "apply":  # both operands are on the value stack
            right, left = values.pop(), values.pop()
            if arg == ids["+"]:
                values.append((left + right) % MODULUS)
            elif arg == ids["-"]:
                values.append((left - right) % MODULUS)
            else:
                values.append((left * right) % MODULUS)
        elif arg <= 4:  # a terminal expression of length 1-4
            digit = stream.below(MODULUS)
            negate = arg in (2, 4)
            bracket = arg >= 3
            tokens.extend([ids["("]] * bracket + [ids["-"]] * negate + [digit] + [ids[")"]] * bracket)
            values.append(-digit % MODULUS if negate else digit)
        else:
            left = 1 + stream.below(arg - 4)
            op = operators[stream.below(len(operators))]
            tokens.append(ids["("])
            # Popped in reverse: left operand, operator token, right operand, combine, closing bracket.
            work.extend([("token", ids[")"]), ("apply", op), ("expr", arg - 3 - left), ("token", op), ("expr", left)])
    return tokens, values[0]


class ModularArithmeticBrackets(Task):
    """A random fully bracketed expression of exactly ``n`` tokens with ``+ - *``; its value mod 5.

    Grammar of the original: ``d``, ``-d``, ``(d)``, ``(-d)`` for lengths 1-4, otherwise ``(L op R)``
    with a uniform split of the remaining length and a uniform operator (the benchmark uses ``mult=True``).
    Input ids: digits 0-4, ``+ - * ( )`` (the original's input size also counted an unused ``x``).
    """

    name, level = "modular_arithmetic_brackets", "context-free"
    input_symbols, output_symbols = _DIGITS + ("+", "-", "*", "(", ")"), _DIGITS

    def _sample(self, batch_size, n, generator):
        ids = {symbol: i for i, symbol in enumerate(self.input_symbols)}
        operators = (ids["+"], ids["-"], ids["*"])
        stream = _UniformStream(generator)
        rows, labels = zip(*(_random_bracket_expression(n, operators, ids, stream) for _ in range(batch_size)))
        return torch.tensor(rows, dtype=torch.long), torch.tensor(labels, dtype=torch.long)[:, None]


class SolveEquation(Task):
    """``E = v``: a bracketed ``+``/``-`` expression E (``n - 2`` tokens) with one digit replaced by ``x``.

    E follows the ``modular_arithmetic_brackets`` grammar without ``*`` (as the original's
    ``SolveEquation``, which keeps ``mult=False``), so ``x`` enters linearly with coefficient ±1 and the
    answer is unique. ``v`` is E's value mod 5; the class is the hidden digit. The hidden digit is
    found as in the original: a uniform position, then the first digit at or after it (cyclically).
    Needs ``n >= 3`` (the original returned all-zero inputs and label 0 below that).
    """

    name, level = "solve_equation", "context-free"
    input_symbols, output_symbols = _DIGITS + ("+", "-", "(", ")", "x", "="), _DIGITS
    min_length, length_rule = 3, "a length >= 3"

    def _sample(self, batch_size, n, generator):
        ids = {symbol: i for i, symbol in enumerate(self.input_symbols)}
        stream = _UniformStream(generator)
        rows, labels = [], []
        for _ in range(batch_size):
            tokens, value = _random_bracket_expression(n - 2, (ids["+"], ids["-"]), ids, stream)
            position = stream.below(len(tokens))
            while tokens[position] >= MODULUS:
                position = (position + 1) % len(tokens)
            labels.append(tokens[position])
            tokens[position] = ids["x"]
            rows.append(tokens + [ids["="], value])
        return torch.tensor(rows, dtype=torch.long), torch.tensor(labels, dtype=torch.long)[:, None]


# ------------------------------------------------------------------------------------------ context-sensitive


class DuplicateString(Task):
    """Binary string ``w``; the answer is ``ww`` (length ``2n``)."""

    name, level = "duplicate_string", "context-sensitive"
    input_symbols, output_symbols = ("0", "1"), ("0", "1")

    def output_length(self, n):
        return 2 * _check_positive_int(n, "n")

    def _sample(self, batch_size, n, generator):
        strings = _rand_bits((batch_size, n), generator)
        return strings, torch.cat([strings, strings], dim=1)


class MissingDuplicateString(Task):
    """``ww`` for a binary ``w`` of length ``n // 2`` with one uniform position replaced by ``?`` (id 2).

    The class is the hidden symbol; an odd ``n`` ends with the pad symbol ``_`` (id 3). Needs ``n >= 2``
    (for ``n = 1`` the original returned a constant input "1" with label 1).
    """

    name, level = "missing_duplicate_string", "context-sensitive"
    input_symbols, output_symbols = ("0", "1", "?", "_"), ("0", "1")
    min_length, length_rule = 2, "a length >= 2"
    MISSING, PAD = 2, 3

    def _sample(self, batch_size, n, generator):
        half = _rand_bits((batch_size, n // 2), generator)
        doubled = torch.cat([half, half], dim=1)
        hidden = torch.randint(0, doubled.shape[1], (batch_size, 1), generator=generator)
        targets = doubled.gather(1, hidden)
        doubled.scatter_(1, hidden, self.MISSING)
        padding = torch.full((batch_size, n % 2), self.PAD, dtype=torch.long)
        return torch.cat([doubled, padding], dim=1), targets


class OddsFirst(Task):
    """Binary string ``s_0 s_1 ... s_{n-1}`` (0-based); answer ``s_1 s_3 s_5 ... s_0 s_2 s_4 ...``.

    The original's docstring puts the 1-based odd positions (``s_0 s_2 ...`` here) first, but its code
    outputs ``x[1::2] + x[0::2]``; the published numbers come from the code, so the code's order is used.
    """

    name, level = "odds_first", "context-sensitive"
    input_symbols, output_symbols = ("0", "1"), ("0", "1")

    def output_length(self, n):
        return _check_positive_int(n, "n")

    def _sample(self, batch_size, n, generator):
        strings = _rand_bits((batch_size, n), generator)
        return strings, torch.cat([strings[:, 1::2], strings[:, 0::2]], dim=1)


class _BinaryOperation(Task):
    """Shared sampler of ``a OP b`` with little-endian binary operands; subclasses define the operation."""

    input_symbols: tuple[str, ...] = ()
    output_symbols = ("0", "1", "END")
    end_token = 2
    OPERATOR = 2
    min_length, length_rule = 3, "a length >= 3 (two non-empty operands and the operator)"

    def _combine(self, a: int, b: int) -> int:
        raise NotImplementedError

    def _sample(self, batch_size, n, generator):
        # len(a) ~ U{1..n-2}, len(b) = n - 1 - len(a); each operand uniform over the non-zero numbers
        # of its width, leading (here: trailing, little-endian) zeros allowed.
        a_length = torch.randint(1, n - 1, (batch_size, 1), generator=generator)
        positions = torch.arange(n)
        bits = _resample_zero_rows(
            _rand_bits((batch_size, n), generator), [positions < a_length, positions > a_length], generator
        )
        inputs = torch.where(positions == a_length, self.OPERATOR, bits)

        out_length = self.output_length(n)
        targets = torch.zeros(batch_size, out_length, dtype=torch.long)
        for row, (bit_row, split) in enumerate(zip(bits.tolist(), a_length[:, 0].tolist())):
            a = _bits_to_int(bit_row[:split][::-1])
            b = _bits_to_int(bit_row[split + 1 :][::-1])
            answer = _int_to_bits(self._combine(a, b))[::-1] + [self.end_token]
            targets[row, : len(answer)] = torch.tensor(answer)
        return inputs, targets


class BinaryAddition(_BinaryOperation):
    """``a + b`` in little-endian binary (lengths summing to ``n - 1``); the sum in little-endian binary.

    Answer (length ``n + 1``): the sum's bits without trailing zeros, the end token 2, then 0s. Needs
    ``n >= 3`` (for ``n <= 2`` the original emitted a lone number without ``+``).
    """

    name, level = "binary_addition", "context-sensitive"
    input_symbols = ("0", "1", "+")

    def output_length(self, n):
        return _check_positive_int(n, "n") + 1

    def _combine(self, a, b):
        return a + b


class BinaryMultiplication(_BinaryOperation):
    """``a * b`` in little-endian binary (lengths summing to ``n - 1``); the product in little-endian binary.

    Answer (length ``n``; the product has at most ``n - 1`` bits): its bits, the end token 2, then 0s.
    Needs ``n >= 3`` (for ``n <= 2`` the original emitted an operator-free input with a fixed answer).
    """

    name, level = "binary_multiplication", "context-sensitive"
    input_symbols = ("0", "1", "*")

    def output_length(self, n):
        return _check_positive_int(n, "n")

    def _combine(self, a, b):
        return a * b


class ComputeSqrt(Task):
    r"""A non-zero ``n``-bit big-endian number ``x``; answer :math:`\lfloor\sqrt{x}\rfloor` big-endian.

    The answer is zero-padded on the left to :math:`\lceil n/2 \rceil` bits, enough for any ``n``-bit ``x``.
    """

    name, level = "compute_sqrt", "context-sensitive"
    input_symbols, output_symbols = ("0", "1"), ("0", "1")

    def output_length(self, n):
        return math.ceil(_check_positive_int(n, "n") / 2)

    def _sample(self, batch_size, n, generator):
        inputs = _resample_zero_rows(
            _rand_bits((batch_size, n), generator), [torch.ones(n, dtype=torch.bool)], generator
        )
        out_length = self.output_length(n)
        targets = torch.zeros(batch_size, out_length, dtype=torch.long)
        for row, bit_row in enumerate(inputs.tolist()):
            root = _int_to_bits(math.isqrt(_bits_to_int(bit_row)))
            targets[row, out_length - len(root) :] = torch.tensor(root)
        return inputs, targets


class BucketSort(Task):
    """String over ``{0..4}``; the answer is the string sorted increasingly."""

    name, level = "bucket_sort", "context-sensitive"
    input_symbols, output_symbols = _DIGITS, _DIGITS

    def output_length(self, n):
        return _check_positive_int(n, "n")

    def _sample(self, batch_size, n, generator):
        strings = torch.randint(0, MODULUS, (batch_size, n), generator=generator)
        return strings, strings.sort(dim=1).values


_TASKS = {
    task.name: task
    for task in (
        EvenPairs,
        ModularArithmetic,
        ParityCheck,
        CycleNavigation,
        StackManipulation,
        ReverseString,
        ModularArithmeticBrackets,
        SolveEquation,
        DuplicateString,
        MissingDuplicateString,
        OddsFirst,
        BinaryAddition,
        BinaryMultiplication,
        ComputeSqrt,
        BucketSort,
    )
}
TASK_NAMES = tuple(_TASKS)


def get_task(name: str) -> Task:
    """A fresh task object for one of :data:`TASK_NAMES`."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}")
    return _TASKS[name]()


def _check_targets(targets: torch.Tensor) -> None:
    if not isinstance(targets, torch.Tensor) or targets.dim() != 2:
        shape = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise ValueError(f"targets must be a (batch, output_length) tensor, got {shape}")


def output_mask(targets: torch.Tensor, task: Task) -> torch.Tensor:
    """Bool ``(B, L)``: the answer positions the benchmark scores.

    Every position, except for tasks with an end token: positions up to and including the first end
    token (all positions of a row without one).
    """
    _check_targets(targets)
    if task.end_token is None:
        return torch.ones_like(targets, dtype=torch.bool)
    is_end = targets == task.end_token
    length = targets.shape[1]
    last_scored = torch.where(is_end.any(dim=1), is_end.int().argmax(dim=1), length - 1)
    return torch.arange(length, device=targets.device) <= last_scored[:, None]


def accuracy(logits: torch.Tensor, targets: torch.Tensor, task: Task, per_sample: bool = False) -> torch.Tensor:
    r"""Per-token accuracy of ``argmax`` predictions over the scored answer positions.

    ``logits`` is ``(B, L, C)`` with ``C >= task.output_vocab`` (only the first ``output_vocab`` classes
    are read, so an encoder's full-vocabulary logits at the answer positions work as they are).
    Returns :math:`\sum \text{correct} \cdot \text{mask} / \sum \text{mask}` over the batch (the
    benchmark's per-batch accuracy) as a 0-d tensor, or one value per sample with ``per_sample=True``.
    """
    _check_targets(targets)
    if logits.dim() != 3 or logits.shape[:2] != targets.shape or logits.shape[2] < task.output_vocab:
        raise ValueError(
            f"logits must be (B, L, >= {task.output_vocab}) matching targets {tuple(targets.shape)}, got "
            f"{tuple(logits.shape)} (for an encoder's output take logits[:, -L:], the answer positions)"
        )
    mask = output_mask(targets, task)
    correct = (logits[..., : task.output_vocab].argmax(dim=-1) == targets) & mask
    if per_sample:
        return correct.sum(dim=1) / mask.sum(dim=1)
    return correct.sum() / mask.sum()


def encoder_inputs(inputs: torch.Tensor, task: Task) -> torch.Tensor:
    """``inputs (B, n)`` followed by ``output_length(n)`` placeholder ids ``task.input_vocab``."""
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2:
        raise ValueError("inputs must be a (batch, n) tensor of input ids")
    placeholders = torch.full(
        (inputs.shape[0], task.output_length(inputs.shape[1])),
        task.placeholder_token,
        dtype=inputs.dtype,
        device=inputs.device,
    )
    return torch.cat([inputs, placeholders], dim=1)


def encoder_targets(targets: torch.Tensor, n: int) -> torch.Tensor:
    """``targets (B, L)`` preceded by ``n`` ignore labels (-1), aligned with :func:`encoder_inputs`."""
    ignored = torch.full(
        (targets.shape[0], _check_positive_int(n, "n")), -1, dtype=targets.dtype, device=targets.device
    )
    return torch.cat([ignored, targets], dim=1)
