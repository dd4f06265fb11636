r"""The fast path's refiners: DAPE's MLP across heads and DAPE-V2's convolutions as one cell MLP (``fast.py``
runs them on blocks of query rows; ``model.py`` holds their paper form).

Each refiner here computes what its ``model.py`` module computes from the module's own weights (read by name:
``HeadMLP.hidden_layer``, ``ConvRefiner.conv1``, ...): ``FUSED_FORMS`` maps each built-in module class to its fused
form, and ``fast.block_form`` checks the pair on a small input before a layer first uses it.

  - **The cell MLP** (``cell_mlp``): the refiner's MLP at every cell (query, key) with the heads as channels. On the
    CPU in float32 it runs the compiled kernel of ``cell_mlp.c`` (``native.py``), which keeps the hidden layer in
    vector registers; elsewhere, or without a C compiler, ``_CellMLP``: batched matmuls that read the scores in
    their channels-first layout and recompute the hidden layer in backward instead of storing it.
  - **The shifted-key convolution**: DAPE-V2's ``1 x kernel`` convolutions as the same cell MLP over ``kernel``
    shifted copies of the scores; the compiled kernel reads the copies in place and adds its shifted outputs up
    itself, the PyTorch form makes them (``_KeyShifts``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from .model import LEAKY_SLOPE, ConvRefiner, DAPEAddRefiner, DAPEConcatRefiner, DAPERefiner

# ----------------------------------------------------------------------------------------------------
# The cell MLP: DAPE's f without permutes, its hidden layer recomputed in backward


class _CellMLP(torch.autograd.Function):
    r"""$Y = W_2\,\mathrm{LeakyReLU}(W_1 X + H_0)$ at every cell: X (batch, C_in, N) channels first -> Y (batch,
    C_out, N).

    The refiners' workhorse. The hidden activation (batch, N, W) is W/C times larger than the scores, so
    backward recomputes it from X instead of keeping it: training memory stays O(batch h T^2). ``hidden_offset``
    $H_0$ (N, W) or (1, W) is the part of the hidden pre-activation that is the same for every sequence
    ($W_B B + b_1$): computed once and broadcast.

    The hidden activation is channels-last, X and Y channels-first, read as transposed views (no copies): the
    products whose inner dimension is the C = 4 heads ran 2.5-3x faster so on CPU (issue 45, RESULTS.md), in
    slices of cells whose passes over the hidden layer stay in cache (``cell_slices``).
    """

    @classmethod
    def run(cls, x, hidden_offset, w_in, w_out):
        """Apply in x's dtype (under autocast the scores may be bfloat16, the weights float32). Autocast is off
        inside, so the output, and with it the gradient that backward receives, has x's dtype: autocast would
        make a float32 x (DAPE-add's S + B) give a bfloat16 output and a gradient backward could not multiply."""
        with torch.autocast(x.device.type, enabled=False):
            return cls.apply(x, *(t.to(x.dtype) for t in (hidden_offset, w_in, w_out)))

    @staticmethod
    def batched(w, batch: int):
        """w as the same matrix for each of ``batch`` sequences. Contiguous first: with a transposed or sliced
        weight the batched matmul alone ran 2-4x slower on CPU."""
        return w.contiguous().expand(batch, -1, -1)

    @staticmethod
    def forward(ctx, x, hidden_offset, w_in, w_out):
        ctx.save_for_backward(x, hidden_offset, w_in, w_out)
        w_in_t, w_out_b = _CellMLP.batched(w_in.t(), len(x)), _CellMLP.batched(w_out, len(x))
        offset, out = hidden_offset.expand(x.shape[-1], -1), x.new_empty(len(x), w_out.shape[0], x.shape[-1])
        for cells in cell_slices(x, w_in.shape[0]):
            hidden = F.leaky_relu_(torch.baddbmm(offset[cells], x[..., cells].mT, w_in_t), LEAKY_SLOPE)
            torch.bmm(w_out_b, hidden.mT, out=out[..., cells])
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, hidden_offset, w_in, w_out = ctx.saved_tensors
        batch = len(x)
        w_in_t, w_out_b = _CellMLP.batched(w_in.t(), batch), _CellMLP.batched(w_out, batch)
        offset = hidden_offset.expand(x.shape[-1], -1)
        grad_x, grad_offset = torch.empty_like(x), torch.empty_like(offset)
        # Per-sequence sums of the weights' gradients, accumulated over the slices, summed over the batch last.
        grad_w_in_t = x.new_zeros(w_in_t.shape)
        grad_w_out = x.new_zeros(w_out_b.shape)
        for cells in cell_slices(x, w_in.shape[0]):
            xs, grad_outs = x[..., cells], grad_out[..., cells]
            hidden = F.leaky_relu_(torch.baddbmm(offset[cells], xs.mT, w_in_t), LEAKY_SLOPE)  # recomputed; its
            grad_w_out.baddbmm_(grad_outs, hidden)  # sign is all LeakyReLU's backward needs
            grad_hidden = torch.bmm(grad_outs.mT, w_out_b)
            leaky_relu_backward(grad_hidden, hidden, LEAKY_SLOPE, False, grad_input=grad_hidden)
            grad_w_in_t.baddbmm_(xs, grad_hidden)
            torch.sum(grad_hidden, 0, out=grad_offset[cells])
            torch.bmm(w_in_t, grad_hidden.mT, out=grad_x[..., cells])
        if hidden_offset.shape[0] == 1:
            grad_offset = grad_offset.sum(0, keepdim=True)
        return grad_x, grad_offset, grad_w_in_t.sum(0).t(), grad_w_out.sum(0)


leaky_relu_backward = torch.ops.aten.leaky_relu_backward.grad_input
# The cell MLP's slices on the CPU: about this many hidden elements (1 MB, one core's L2), and at least this many
# cells (256-cell slices, 32 sequences at T = 128, were 3-10 % faster than 1,024-cell ones in DAPE's step).
HIDDEN_SLICE_ELEMENTS, MIN_SLICE_CELLS = 2**18, 256


def cell_slices(x, width: int) -> list[slice]:
    """Slices of x's cells (last axis) for the cell MLP: one on an accelerator (few, large kernels), on the CPU
    slices whose hidden activation (batch, cells, width) holds about HIDDEN_SLICE_ELEMENTS."""
    n = x.shape[-1]
    step = n if x.device.type != "cpu" else max(MIN_SLICE_CELLS, HIDDEN_SLICE_ELEMENTS // (len(x) * width))
    return [slice(start, min(n, start + step)) for start in range(0, n, step)]


def _hidden_offset(b_in, w_bias=None, bias=None):
    """$H_0 = b_1$ (1, W), plus $(W_B B)^\top$ (N, W) when the refiner reads the bias (C_B, N)."""
    offset = b_in[None, :]
    return offset if bias is None else torch.addmm(offset, bias.mT, w_bias.mT)


class _CompiledCellMLP(torch.autograd.Function):
    """``native.forward`` with ``native.backward`` as its gradient (float32 on the CPU)."""

    @staticmethod
    def forward(ctx, x, shared, w_in, b_in, w_out, mask, reach, kernel):
        ctx.save_for_backward(x, shared, w_in, b_in, w_out, mask)
        ctx.reach, ctx.kernel = reach, kernel
        return native.forward(x, shared, w_in, b_in, w_out, LEAKY_SLOPE, mask, reach, kernel)

    @staticmethod
    def backward(ctx, grad_out):
        *operands, mask = ctx.saved_tensors
        return *native.backward(*operands, grad_out, LEAKY_SLOPE, mask, ctx.reach, ctx.kernel), None, None, None


def cell_mlp(x, shared, w_in, b_in, w_out, mask=None):
    r"""$W_{out}\,\mathrm{LeakyReLU}(W_{in} [x; s] + b_{in})$ at every cell: x (batch, C_x, N) per sequence, shared
    s (C_s, N) the same for every sequence (DAPE's bias) or None, w_in (W, C_x + C_s), b_in (W), w_out (C_out, W)
    -> (batch, C_out, N). The compiled kernel where it can run (``native.usable``), else ``_CellMLP``. With
    ``mask`` (rows, keys), the cells attention keeps, the compiled kernel skips the cells it drops (their outputs
    are 0 there, where the PyTorch form computes them: attention reads neither)."""
    if native.usable(x, shared, w_in, w_out):
        return _CompiledCellMLP.apply(x, shared, w_in, b_in, w_out, mask, 0, 0)
    c_x = x.shape[1]
    return _CellMLP.run(x, _hidden_offset(b_in, w_in[:, c_x:], shared), w_in[:, :c_x], w_out)


def head_mlp(f, x, bias=None, residual=None, mask=None):
    r"""$x + f([x, B]) + R$ with $f$ a ``model.HeadMLP``: x (batch, h, Tq, Tk), the
    bias $B$ and the residual $R$ (h, Tq, Tk) or None. The bias half of the first layer, $W_B B$, the same for
    every sequence, is computed once, not once per sequence (a bias read from the data differs per sequence)."""
    first, last = f.hidden_layer, f.output_layer
    batch, h, Tq, Tk = x.shape
    if bias is not None and bias.dim() == 4:  # read from the data: [x, B] per sequence
        cells, shared, w_in = torch.cat([x, bias.to(x.dtype)], dim=1).reshape(batch, 2 * h, -1), None, first.weight
    elif bias is None:  # no bias: B = 0, the first layer's bias half reads nothing
        cells, shared, w_in = x.reshape(batch, h, -1), None, first.weight[:, :h]
    else:
        cells, shared, w_in = x.reshape(batch, h, -1), bias.reshape(h, -1).to(x.dtype), first.weight
    out = cell_mlp(cells, shared, w_in, first.bias, last.weight, mask).view(batch, h, Tq, Tk)
    return _residual_sum(x, out, last.bias, residual)


def _residual_sum(x, out, out_bias, residual=None):
    r"""$x + \mathrm{out} + b$ (+ the bias residual $R$ (h, Tq, Tk)) in the dtype of model.py's sum: x's, or with a
    residual the promotion of both (under autocast bf16 scores plus the float32 bias are float32, so the reference
    softmaxes float32 there, and so does this)."""
    output_offset = out_bias[:, None, None] if residual is None else residual + out_bias[:, None, None]
    dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    return torch.add(x, out).to(dtype).add_(output_offset)  # two passes over the batch: (h, Tq, Tk) terms summed first


def dape(refiner, scores, bias, mask):
    """$S + B + f([S, B])$ (``model.DAPERefiner``)."""
    return head_mlp(refiner.f, scores, bias, residual=bias, mask=mask)


def dape_concat(refiner, scores, bias, mask):
    """$S + f([S, B])$ (``model.DAPEConcatRefiner``)."""
    return head_mlp(refiner.f, scores, bias, mask=mask)


def dape_add(refiner, scores, bias, mask):
    """$(S + B) + f(S + B)$ (``model.DAPEAddRefiner``)."""
    return head_mlp(refiner.f, scores if bias is None else scores + bias, mask=mask)


# ----------------------------------------------------------------------------------------------------
# The shifted-key convolution: DAPE-V2's 1 x kernel convolutions as the same cell MLP


def _shifted_copies(x, kernel: int):
    r"""(batch, C, R, K) -> (batch, kernel, C, R, K): copy t is x moved along the keys by $d_t = t - kernel/2$,
    $X_t[\dots, j] = x[\dots, j + d_t]$, zero where $j + d_t$ falls outside the row."""
    out = x.new_empty(x.shape[0], kernel, *x.shape[1:])
    n_keys = x.shape[-1]
    for t in range(kernel):
        d = t - kernel // 2
        lo, hi = max(0, -d), n_keys - max(0, d)  # the keys j whose j + d lies in the row
        out[:, t, ..., lo:hi] = x[..., lo + d : hi + d]
        out[:, t, ..., :lo] = 0
        out[:, t, ..., hi:] = 0
    return out


def _summed_shifts(y, kernel: int):
    r"""The adjoint of ``_shifted_copies``: (batch, kernel, C, R, K) -> (batch, C, R, K),
    $\sum_t Y_t[\dots, j - d_t]$."""
    out = y[:, kernel // 2].clone()
    n_keys = y.shape[-1]
    for t in range(kernel):
        d = t - kernel // 2
        if d:
            lo, hi = max(0, -d), n_keys - max(0, d)
            out[..., lo + d : hi + d] += y[:, t, ..., lo:hi]
    return out


class _KeyShifts(torch.autograd.Function):
    """``_shifted_copies`` (or, with ``adjoint``, ``_summed_shifts``) whose backward pass is the other one."""

    @staticmethod
    def forward(ctx, x, kernel: int, adjoint: bool):
        ctx.kernel, ctx.adjoint = kernel, adjoint
        return _summed_shifts(x, kernel) if adjoint else _shifted_copies(x, kernel)

    @staticmethod
    def backward(ctx, grad):
        return (_shifted_copies(grad, ctx.kernel) if ctx.adjoint else _summed_shifts(grad, ctx.kernel)), None, None


def conv(refiner, scores, bias, mask):
    r"""$S + B + \mathrm{conv}_2(\mathrm{LeakyReLU}(\mathrm{conv}_1(\mathrm{tril}([S, B]))))$ (``model.ConvRefiner``).

    conv1 is a matrix over the ``kernel`` shifted copies of the input ($X_t[j] = X[j + t - kernel/2]$), and conv2
    a matrix giving ``kernel`` per-tap outputs at each key, which are shifted into place and summed:
    $\mathrm{conv_2}(H)_j = \sum_t (W_2^{(t)} H)_{j + t - kernel/2}$ -- the transpose of making the copies, with
    the taps in reverse order. The compiled kernel (float32 on the CPU) does the copies, ``tril`` and the summing
    itself; the PyTorch form makes them in memory.
    """
    batch, h, Tq, Tk = scores.shape
    kernel = refiner.conv1.kernel_size[1]

    def copies(x):  # tril, then (batch, C, Tq, Tk) -> (batch, kernel * C, Tq * Tk)
        return _KeyShifts.apply(x.masked_fill(~mask, 0), kernel, False).flatten(1, 2).flatten(2)

    w1 = refiner.conv1.weight[:, :, 0].transpose(1, 2)  # (W, kernel, C_in)
    w2 = refiner.conv2.weight[:, :, 0].flip(-1).permute(2, 0, 1).flatten(0, 1)  # (kernel * h, W), taps reversed
    if bias is not None and bias.dim() == 4:  # a bias read from the data differs per sequence: [S, B] as input
        stored, shared, w_in = torch.cat([scores, bias.to(scores.dtype)], dim=1), None, w1.flatten(1)
    elif bias is None:
        stored, shared, w_in = scores, None, w1[..., :h].flatten(1)
    else:  # the bias, the same for every sequence, as the shared input
        stored, shared = scores, bias.to(scores.dtype).reshape(h, -1)
        w_in = torch.cat([w1[..., :h].flatten(1), w1[..., h:].flatten(1)], dim=1)
    stored = stored.reshape(batch, -1, Tq * Tk)
    if native.usable(stored, shared, w_in, w2, kernel):  # the copies made, shifted and summed in C
        convolved = _CompiledCellMLP.apply(stored, shared, w_in, refiner.conv1.bias, w2, mask, kernel // 2, kernel)
        convolved = convolved.view(batch, h, Tq, Tk)
    else:
        shared = None if shared is None else copies(shared.view(1, h, Tq, Tk))[0]
        taps = _CellMLP.run(
            copies(stored.view(batch, -1, Tq, Tk)),
            _hidden_offset(refiner.conv1.bias, w_in[:, stored.shape[1] * kernel :], shared),
            w_in[:, : stored.shape[1] * kernel],
            w2,
        )
        convolved = _KeyShifts.apply(taps.view(batch, kernel, h, Tq, Tk), kernel, True)
    return _residual_sum(scores, convolved, refiner.conv2.bias, bias)


# The fused form of each built-in refiner, by exact class (a subclass may compute something else); checked
# against the module's own forward before first use (``block_form``).
FUSED_FORMS = {DAPERefiner: dape, DAPEConcatRefiner: dape_concat, DAPEAddRefiner: dape_add, ConvRefiner: conv}
