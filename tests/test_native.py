"""The refiners' compiled cell MLP (minidape/cell_mlp.c through minidape/native.py) computes the papers' MLP at
every cell, forward and every gradient, for the shapes the built-in refiners meet and any other; a model uses it on
the CPU and trains to what its PyTorch form gives; without a compiler, or with MINIDAPE_NATIVE=0, the PyTorch form
runs; nothing compiled is left on disk."""

import os
import shutil
import warnings

import pytest
import torch
import torch.nn as nn
from test_model import tiny

import minidape as md
from minidape import fast_refiners, native

needs_a_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")


def papers_mlp(x, shared, w_in, b_in, w_out):
    """DAPE's f as the paper writes it, in float64: at every cell the vector [x; s] of its channels goes through
    Linear(C_in, W), LeakyReLU(0.01) and Linear(W, C_out) without a bias (minidape adds that one outside)."""
    batch, _, n = x.shape
    cells = x if shared is None else torch.cat([x, shared.expand(batch, -1, -1)], dim=1)
    f = nn.Sequential(
        nn.Linear(w_in.shape[1], w_in.shape[0]), nn.LeakyReLU(0.01), nn.Linear(*w_out.shape[::-1], bias=False)
    )
    f = f.double()
    with torch.no_grad():
        f[0].weight.copy_(w_in), f[0].bias.copy_(b_in), f[2].weight.copy_(w_out)
    y = f(cells.transpose(1, 2)).transpose(1, 2)  # (batch, cells, C_in) -> (batch, C_out, cells)
    return y, f


# (batch, C_x, C_s, C_out, width, cells): the specialised shapes (DAPE over 4 and 8 heads with its bias shared or
# read from the data, the 1 x 3 conv over 4 heads) and general ones; cell counts that are not a multiple of the 8
# cells of a vector, one cell, and enough cells for several threads' ranges
SHAPES = [
    (2, 4, 4, 4, 32, 1000),
    (3, 4, 0, 4, 32, 13),
    (2, 8, 0, 4, 32, 77),
    (1, 8, 8, 8, 32, 1),
    (2, 12, 12, 12, 32, 1003),
    (2, 12, 0, 12, 16, 9),
    (2, 5, 3, 7, 9, 1003),
    (4, 3, 1, 2, 64, 5000),
]


@needs_a_compiler
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_compiled_cell_mlp_computes_the_papers_mlp_and_its_gradients(shape, threads, monkeypatch):
    batch, c_x, c_s, c_out, width, n = shape
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # the ranges native.py splits the cells into
    g = torch.Generator().manual_seed(sum(shape))
    x, w_in, b_in = (
        torch.randn(batch, c_x, n, generator=g),
        torch.randn(width, c_x + c_s, generator=g),
        torch.randn(width, generator=g),
    )
    shared, w_out = torch.randn(c_s, n, generator=g) if c_s else None, torch.randn(c_out, width, generator=g)
    grad_y = torch.randn(batch, c_out, n, generator=g)

    x64 = x.double().requires_grad_()
    s64 = None if shared is None else shared.double().requires_grad_()
    expected, f = papers_mlp(x64, s64, w_in.double(), b_in.double(), w_out.double())
    expected.backward(grad_y.double())
    expected_grads = [x64.grad, None if s64 is None else s64.grad, f[0].weight.grad, f[0].bias.grad, f[2].weight.grad]

    y = native.forward(x, shared, w_in, b_in, w_out, 0.01)
    grads = native.backward(x, shared, w_in, b_in, w_out, grad_y, 0.01)
    assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    for name, got, want in zip(("x", "shared", "w_in", "b_in", "w_out"), grads, expected_grads, strict=True):
        if want is None:
            assert got is None
            continue
        assert got.shape == want.shape, name
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item()), name


@needs_a_compiler
@pytest.mark.parametrize("refiner", ["dape", "dape_concat", "dape_add", "conv"])
@pytest.mark.parametrize("pe", ["kerple_log", "rope", "fox"], ids=["bias", "no-bias", "bias-read-from-the-data"])
def test_a_model_runs_the_compiled_kernel_and_trains_to_its_pytorch_forms_numbers(pe, refiner, monkeypatch):
    calls = []
    compiled = native.forward
    monkeypatch.setattr(native, "forward", lambda *args: calls.append(args[0].shape) or compiled(*args))
    tokens = torch.randint(0, 64, (3, 21), generator=torch.Generator().manual_seed(2))

    def loss_and_grads(native_setting):
        monkeypatch.setenv("MINIDAPE_NATIVE", native_setting)
        torch.manual_seed(0)
        model = md.GPT(tiny(pe=pe, refiner=refiner, attn_chunk=8))
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        return loss, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    loss, grads = loss_and_grads("1")
    assert calls, "the model did not run the compiled kernel"
    count = len(calls)
    pytorch_loss, pytorch_grads = loss_and_grads("0")
    assert len(calls) == count, "MINIDAPE_NATIVE=0 still ran the compiled kernel"
    assert torch.allclose(loss, pytorch_loss, atol=1e-5)
    assert grads.keys() == pytorch_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, pytorch_grads[name], atol=1e-5, rtol=1e-4), name


def test_without_a_compiler_the_pytorch_form_runs_and_a_failing_one_is_said_once(monkeypatch, tmp_path):
    monkeypatch.setattr(native.library, "__wrapped__", native.library.__wrapped__)  # restored with the cache below
    native.library.cache_clear()
    try:
        monkeypatch.setenv("CC", "no-such-compiler-anywhere")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no compiler: the documented PyTorch form, without a warning
            assert native.library() is None
        x = torch.randn(2, 4, 30)
        assert not native.usable(x, None, torch.randn(32, 4), torch.randn(4, 32))
        model = md.GPT(tiny(pe="kerple_log", refiner="dape"))
        _, loss = model(torch.randint(0, 64, (2, 9)), torch.randint(0, 64, (2, 9)))
        loss.backward()  # the PyTorch form trains

        native.library.cache_clear()
        failing = tmp_path / "cc"
        failing.write_text("#!/bin/sh\necho 'cc: error: no such thing' >&2\nexit 1\n")
        failing.chmod(0o755)
        monkeypatch.setenv("CC", str(failing))
        with pytest.warns(UserWarning, match="could not compile its cell MLP.*no such thing"):
            assert native.library() is None
    finally:
        native.library.cache_clear()  # the next user compiles with the real compiler again


@needs_a_compiler
def test_the_build_is_cached_whole_per_machine_and_loaded_without_compiling(monkeypatch, tmp_path):
    """The first use compiles into the cache (one finished file, no temporary left); a later process loads that
    file without running the compiler; another CPU or compiler would get another file (the key says which)."""
    monkeypatch.setenv("MINIDAPE_CACHE", str(tmp_path))
    native.library.cache_clear()
    try:
        assert native.library() is not None
        built = list(tmp_path.rglob("*"))
        assert [p.name for p in built if p.is_file()] == [
            f"cell_mlp-{native._build_key(shutil.which('cc'), native.FLAG_SETS[0])}.so"
        ]
        native.library.cache_clear()
        failing = tmp_path / "cc-that-fails"
        failing.write_text("#!/bin/sh\ncase \"$1\" in --version) cc --version;; *) exit 1;; esac\n")
        failing.chmod(0o755)
        monkeypatch.setattr(native, "_build_key", lambda compiler, flags: built[-1].stem.removeprefix("cell_mlp-"))
        monkeypatch.setenv("CC", str(failing))
        assert native.library() is not None  # loaded from the cache: the failing compiler was not needed
        monkeypatch.undo()
        monkeypatch.setattr(native, "_this_cpu", lambda: "another processor")
        assert native._build_key(shutil.which("cc"), native.FLAG_SETS[0]) != built[-1].stem.removeprefix("cell_mlp-")
    finally:
        native.library.cache_clear()


@needs_a_compiler
def test_a_cache_that_cannot_be_written_builds_for_the_process_alone(monkeypatch, tmp_path):
    """A read-only home (the cache cannot be created): the kernel is built in a temporary folder, loaded and the
    folder removed; no warning, nothing left."""
    (tmp_path / "read-only").mkdir(mode=0o500)
    monkeypatch.setenv("MINIDAPE_CACHE", str(tmp_path / "read-only" / "cache"))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "temporary"))
    (tmp_path / "temporary").mkdir()
    native.library.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            if os.geteuid() == 0:  # root writes anywhere: make the folder fail as a read-only one would
                monkeypatch.setattr(native, "_compile", _failing_in_the_cache(native._compile, tmp_path / "read-only"))
            assert native.library() is not None
        assert list((tmp_path / "temporary").iterdir()) == [] and list((tmp_path / "read-only").iterdir()) == []
    finally:
        native.library.cache_clear()


def _failing_in_the_cache(compile_, cache):
    def compile_unless_in_the_cache(compiler, flags, built):
        if cache in built.parents:
            raise PermissionError(f"[Errno 13] Permission denied: '{built.parent}'")
        return compile_(compiler, flags, built)

    return compile_unless_in_the_cache


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_a_bad_minidape_native_is_refused_by_name(value, monkeypatch):
    monkeypatch.setenv("MINIDAPE_NATIVE", value)
    with pytest.raises(ValueError, match=f"MINIDAPE_NATIVE='{value}'.*valid values: 1 or unset .* and 0"):
        native.enabled()


def test_the_kernels_own_limits_send_larger_refiners_to_the_pytorch_form():
    x = torch.randn(1, 200, 16)  # 200 input channels: past the kernel's 128
    assert not native.usable(x, None, torch.randn(32, 200), torch.randn(4, 32))
    assert not native.usable(torch.randn(1, 4, 16, dtype=torch.float64), None, torch.randn(32, 4), torch.randn(4, 32))
    assert fast_refiners.cell_mlp(x, None, torch.randn(32, 200), torch.zeros(32), torch.randn(4, 32)).shape == (
        1,
        4,
        16,
    )


@needs_a_compiler
@pytest.mark.parametrize("reach", [0, 1, 2])
def test_cells_no_kept_cell_reads_are_skipped_and_the_rest_is_the_papers_mlp(reach):
    """A causal block of 24 query rows (the 17th to the 40th) against 48 keys: the groups of 8 cells with no kept
    cell within ``reach`` keys get 0 and no gradient; every other cell is the paper's MLP, and so are the weights'
    gradients when the incoming gradient is zero where attention drops a cell (as it is in a model)."""
    rows, keys, first_row, batch = 24, 48, 16, 3
    mask = torch.arange(keys)[None, :] <= torch.arange(first_row, first_row + rows)[:, None]
    g = torch.Generator().manual_seed(reach)
    x, w_in, b_in = (
        torch.randn(batch, 4, rows * keys, generator=g),
        torch.randn(32, 8, generator=g),
        torch.randn(32, generator=g),
    )
    shared, w_out = torch.randn(4, rows * keys, generator=g), torch.randn(4, 32, generator=g)
    near = mask.clone()  # the cells within reach of a kept one, as the conv reads them
    for shift in range(1, reach + 1):
        near[:, :-shift] |= mask[:, shift:]
        near[:, shift:] |= mask[:, :-shift]
    group_read = near.view(rows, keys // 8, 8).any(-1, keepdim=True).expand(-1, -1, 8).reshape(-1)

    x64, s64 = x.double().requires_grad_(), shared.double().requires_grad_()
    expected, f = papers_mlp(x64, s64, w_in.double(), b_in.double(), w_out.double())
    grad_y = torch.randn(expected.shape, generator=g, dtype=torch.float64) * near.reshape(-1)  # zero where unread
    expected.backward(grad_y)

    y = native.forward(x, shared, w_in, b_in, w_out, 0.01, mask, reach)
    grad_x, grad_s, grad_w_in, grad_b_in, grad_w_out = native.backward(
        x, shared, w_in, b_in, w_out, grad_y.float(), 0.01, mask, reach
    )
    assert not group_read.all() and group_read.any()
    assert (y[..., ~group_read] == 0).all() and (grad_x[..., ~group_read] == 0).all()
    assert torch.allclose(y[..., group_read].double(), expected[..., group_read], rtol=1e-5, atol=1e-4)
    for got, want in ((grad_x, x64.grad), (grad_s, s64.grad)):
        assert torch.allclose(got[..., group_read].double(), want[..., group_read], rtol=1e-5, atol=1e-4)
    for got, want in ((grad_w_in, f[0].weight.grad), (grad_b_in, f[0].bias.grad), (grad_w_out, f[2].weight.grad)):
        assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-3)


@needs_a_compiler
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kernel, rows, keys, with_bias", [(3, 16, 48, True), (5, 9, 21, True), (3, 40, 64, False)])
def test_the_shifted_cell_mlp_is_dape_v2s_convolutions(kernel, rows, keys, with_bias, threads, monkeypatch):
    """With ``kernel`` k the compiled kernel is DAPE-V2's conv2(LeakyReLU(conv1(tril([S, B])))) of 1 x k
    convolutions along the keys (nn.Conv2d, zero padding k // 2) where attention reads it, forward and every
    gradient; rows of 21 keys cross the groups of 8 cells, and two threads split the rows."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    batch, h, width = 3, 4, 16
    g = torch.Generator().manual_seed(kernel * rows)
    first_row = keys - rows  # the block's last query sees every key
    mask = torch.arange(keys)[None, :] <= torch.arange(first_row, first_row + rows)[:, None]
    conv1 = nn.Conv2d(2 * h if with_bias else h, width, (1, kernel), padding=(0, kernel // 2)).double()
    conv2 = nn.Conv2d(width, h, (1, kernel), padding=(0, kernel // 2), bias=False).double()
    scores = torch.randn(batch, h, rows, keys, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(h, rows, keys, generator=g, dtype=torch.float64, requires_grad=True)
    cells = torch.cat([scores, bias.expand(batch, -1, -1, -1)], 1) if with_bias else scores
    expected = conv2(nn.functional.leaky_relu(conv1(cells.masked_fill(~mask, 0)), 0.01))
    grad_y = torch.randn(expected.shape, generator=g, dtype=torch.float64) * mask  # attention drops the rest
    expected.backward(grad_y)

    w1 = conv1.weight.detach()[:, :, 0].transpose(1, 2)  # (W, k, C_in): MLP channel t * C + c
    w_in = torch.cat([w1[..., :h].flatten(1), w1[..., h:].flatten(1)], 1) if with_bias else w1.flatten(1)
    w_out = conv2.weight.detach()[:, :, 0].flip(-1).permute(2, 0, 1).flatten(0, 1)  # (k * h, W): taps reversed
    x = scores.detach().float().reshape(batch, h, -1)
    shared = bias.detach().float().reshape(h, -1) if with_bias else None
    operands = (x, shared, w_in.float(), conv1.bias.detach().float(), w_out.float())
    y = native.forward(*operands, 0.01, mask, kernel // 2, kernel)
    grads = native.backward(*operands, grad_y.float().reshape(batch, h, -1), 0.01, mask, kernel // 2, kernel)

    kept = mask.expand_as(expected)  # what attention reads of the refiner's output
    assert torch.allclose(y.double().view_as(expected)[kept], expected[kept], rtol=1e-5, atol=1e-5)
    assert torch.allclose(grads[0].double().view_as(scores), scores.grad, rtol=1e-5, atol=1e-5)
    if with_bias:
        assert torch.allclose(grads[1].double().view_as(bias), bias.grad, rtol=1e-5, atol=1e-5)
    w_grad = conv1.weight.grad[:, :, 0].transpose(1, 2)
    w_in_grad = (
        torch.cat([w_grad[..., :h].flatten(1), w_grad[..., h:].flatten(1)], 1) if with_bias else w_grad.flatten(1)
    )
    w_out_grad = conv2.weight.grad[:, :, 0].flip(-1).permute(2, 0, 1).flatten(0, 1)
    for got, want in ((grads[2], w_in_grad), (grads[3], conv1.bias.grad), (grads[4], w_out_grad)):
        assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4)


def _forward_on_two_threads(queue):
    x, w_in, b_in, w_out = torch.ones(2, 4, 4096), torch.ones(32, 4), torch.zeros(32), torch.ones(4, 32)
    queue.put(float(native.forward(x, None, w_in, b_in, w_out, 0.01).sum()))


@needs_a_compiler
def test_a_forked_child_runs_the_kernel_on_its_own_threads(monkeypatch):
    """A process forked after the kernel ran on a pool of threads has none of them: it makes its own pool (a pool
    inherited from the parent would wait forever for threads that are not there)."""
    import multiprocessing

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert len(native._ranges(2 * 4096)) == 2
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    _forward_on_two_threads(queue)  # the parent's pool
    child = context.Process(target=_forward_on_two_threads, args=(queue,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    assert queue.get(timeout=5) == queue.get(timeout=5) == 2 * 4 * 4096 * 128  # 4 channels x 32 units of 4
