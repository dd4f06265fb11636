"""Training: schedule, learning, history, checkpoints, exact resume, devices, errors, DDP under torchrun."""

import contextlib
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import minidape as md
from minidape import fast_encodings
from minidape.lab import distributed
from minidape.lab.checkpoints import CHECKPOINT_NAME, load_checkpoint, read_checkpoint
from minidape.lab.data import get_batch
from minidape.lab.train import lr_at, seed_everything, step_seed
from minidape.utils import atomic_path, resolve_device

train_module = sys.modules["minidape.lab.train"]  # md.train is the function; this is the module
REPO = Path(__file__).resolve().parent.parent
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16)


@pytest.fixture(scope="module")
def corpus():
    """A slice of the books corpus: enough text for tiny runs, small enough to stay fast."""
    return md.load_corpus("austen", "train")[:200_000], md.load_corpus("austen", "val")[:20_000]


def state_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_cosine_schedule_with_warmup():
    # warmup 10 of 110 steps, peak 1.0, floor 0.1: linear ramp, then half a cosine from 1.0 down to 0.1
    assert lr_at(0, 110, 1.0, 0.1, 10) == pytest.approx(0.1)
    assert lr_at(4, 110, 1.0, 0.1, 10) == pytest.approx(0.5)
    assert lr_at(9, 110, 1.0, 0.1, 10) == pytest.approx(1.0)
    assert lr_at(10, 110, 1.0, 0.1, 10) == pytest.approx(1.0)
    assert lr_at(60, 110, 1.0, 0.1, 10) == pytest.approx(0.55)  # halfway through the cosine
    assert lr_at(35, 110, 1.0, 0.1, 10) == pytest.approx(0.1 + 0.45 * (1 + 2**-0.5))  # a quarter: cos(pi/4)
    assert lr_at(110, 110, 1.0, 0.1, 10) == pytest.approx(0.1)
    rates = [lr_at(step, 110, 1.0, 0.1, 10) for step in range(10, 111)]
    assert all(later <= earlier for earlier, later in zip(rates, rates[1:]))


def test_loss_goes_down_and_history_is_complete(corpus):
    train_tokens, val_tokens = corpus
    model, history = md.train(
        md.GPTConfig(**TINY, pe="alibi"),
        train_tokens,
        val_data=val_tokens,
        steps=60,
        batch_size=16,
        lr=3e-3,
        eval_every=20,
        log_every=5,
        device="cpu",
        progress=False,
    )
    assert [entry["step"] for entry in history] == list(range(0, 61, 5))
    assert [entry["step"] for entry in history if "val_loss" in entry] == [0, 20, 40, 60]
    first, last = history[0], history[-1]
    assert first["loss"] == pytest.approx(torch.log(torch.tensor(256.0)).item(), abs=0.3)  # an untrained guess
    assert last["loss"] < first["loss"] - 1.0
    assert last["val_loss"] < first["val_loss"] - 1.0
    assert not model.training  # returned ready for evaluation


def test_same_seed_same_run_other_seed_other_run(corpus):
    train_tokens, _ = corpus
    cfg = md.GPTConfig(**TINY, pe="rope", dropout=0.1)
    runs = [
        md.train(cfg, train_tokens, steps=3, batch_size=4, seed=seed, device="cpu", progress=False)[0]
        for seed in (5, 5, 6)
    ]
    assert state_equal(runs[0].state_dict(), runs[1].state_dict())
    assert not state_equal(runs[0].state_dict(), runs[2].state_dict())


class Interrupted(Exception):
    pass


@contextlib.contextmanager
def stopped_after_checkpoint(step: int):
    """Training inside the block stops (raises `Interrupted`, expected) right after writing its checkpoint of
    `step`, as a run killed at that moment."""
    save = train_module.save_checkpoint

    def save_then_stop(path, model, optimizer, step_done, *args, **kwargs):
        save(path, model, optimizer, step_done, *args, **kwargs)
        if step_done == step:
            raise Interrupted

    with pytest.MonkeyPatch.context() as patch, pytest.raises(Interrupted):
        patch.setattr(train_module, "save_checkpoint", save_then_stop)
        yield


def test_resume_continues_exactly(corpus, tmp_path):
    """Stop a run right after its step-4 checkpoint, resume it, and compare with a run never stopped.

    Dropout is on, so the random state of every step must be reproduced, not only the weights and Adam's moments.
    """
    train_tokens, val_tokens = corpus
    cfg = md.GPTConfig(**TINY, pe="kerple_log", refiner="dape", refiner_width=8, dropout=0.1)
    settings = dict(
        data=train_tokens,
        val_data=val_tokens,
        steps=8,
        batch_size=4,
        lr=3e-3,
        eval_every=2,
        checkpoint_every=4,
        seed=11,
        device="cpu",
        progress=False,
    )
    whole, whole_history = md.train(cfg, out=tmp_path / "whole", **settings)

    with stopped_after_checkpoint(4):
        md.train(cfg, out=tmp_path / "cut", **settings)
    assert read_checkpoint(tmp_path / "cut")["step"] == 4

    resumed, resumed_history = md.train(None, out=tmp_path / "cut", resume=True, **settings)
    assert state_equal(whole.state_dict(), resumed.state_dict())  # bitwise
    assert resumed_history == whole_history
    final = read_checkpoint(tmp_path / "cut")
    assert final["step"] == 8 and state_equal(final["model"], whole.state_dict())


def test_resume_rebuilds_the_optimizer_for_its_own_device(corpus, tmp_path, monkeypatch):
    """An optimizer state records the implementation it ran with (`fused`, `foreach`), which belongs to the
    device it was saved on: here a per-tensor optimizer's, as a CPU run of an earlier version saved it. The
    resumed run keeps the implementation chosen for its own device and loads only the training state."""
    train_tokens, _ = corpus
    quick_run(tmp_path, train_tokens, steps=4)
    saved = read_checkpoint(tmp_path)
    for group in saved["optimizer"]["param_groups"]:
        group.update(fused=None, foreach=True)
    torch.save(saved, tmp_path / CHECKPOINT_NAME)

    built, build = [], train_module._optimizer

    def recording_build(*args, **kwargs):
        optim = build(*args, **kwargs)
        built.append((optim, [{key: group[key] for key in ("fused", "foreach")} for group in optim.param_groups]))
        return optim

    monkeypatch.setattr(train_module, "_optimizer", recording_build)
    quick_run(tmp_path, train_tokens, steps=6, resume=True)
    ((optim, chosen),) = built
    assert [{key: group[key] for key in ("fused", "foreach")} for group in optim.param_groups] == chosen
    assert {float(state["step"]) for state in optim.state.values()} == {6.0}  # 4 saved steps + 2 resumed


def test_resume_refuses_a_different_model(corpus, tmp_path):
    train_tokens, _ = corpus
    md.train(md.GPTConfig(**TINY), train_tokens, steps=2, batch_size=2, out=tmp_path, device="cpu", progress=False)
    with pytest.raises(ValueError, match="differs from the checkpoint's in: n_embd"):
        md.train(
            md.GPTConfig(**{**TINY, "n_embd": 64}),
            train_tokens,
            steps=4,
            batch_size=2,
            out=tmp_path,
            resume=True,
            device="cpu",
            progress=False,
        )
    with pytest.raises(ValueError, match="resume=True needs out="):
        md.train(None, train_tokens, steps=4, resume=True, progress=False)


def test_checkpoint_is_plain_state_written_atomically(corpus, tmp_path):
    train_tokens, _ = corpus
    model, history = md.train(
        md.GPTConfig(**TINY, pe="fire"),
        "austen",
        steps=3,
        batch_size=2,
        weight_decay=0.05,
        out=tmp_path,
        device="cpu",
        progress=False,
        eval_windows=2,
    )
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_NAME]  # no temporary file left behind
    checkpoint = torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)  # plain tensors, numbers, strings
    assert checkpoint["step"] == 3 and checkpoint["corpus"] == {"name": "austen"} and checkpoint["history"] == history
    assert checkpoint["sources"] == {}  # built-in PE and refiner: no file to import
    assert checkpoint["config"] == {**md.GPTConfig(**TINY, pe="fire").__dict__}
    groups = checkpoint["optimizer"]["param_groups"]
    assert {group["betas"] for group in groups} == {(0.9, 0.95)}
    assert sorted(group["weight_decay"] for group in groups) == [0.0, 0.05]  # no decay on biases and norms
    loaded, _ = load_checkpoint(tmp_path, "cpu")
    assert state_equal(loaded.state_dict(), model.state_dict()) and not loaded.training


def test_corrupt_truncated_and_foreign_checkpoints_are_clear_errors(corpus, tmp_path):
    train_tokens, _ = corpus
    md.train(
        md.GPTConfig(**TINY), train_tokens, steps=1, batch_size=2, out=tmp_path / "run", device="cpu", progress=False
    )
    good = (tmp_path / "run" / CHECKPOINT_NAME).read_bytes()
    cases = {"truncated.pt": good[: len(good) // 2], "corrupt.pt": bytes(reversed(good))}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=f"cannot read checkpoint .*{name}: the file is truncated or corrupt"):
            load_checkpoint(tmp_path / name)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a minidape checkpoint: missing model, config"):
        load_checkpoint(tmp_path / "foreign.pt")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "absent.pt")


def test_atomic_path_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "results.md"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("the writer crashed")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["results.md"]
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["results.md"]


def test_device_choice(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="'cuda'.*CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="'mps'.*MPS is not available"):
        resolve_device("mps")
    with pytest.raises(ValueError, match="unknown device 'gpu'.*auto, cpu, cuda, mps"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")  # CUDA first


@pytest.mark.parametrize(
    "argument, value, message",
    [
        ("steps", 0, "steps must be an integer >= 1, got 0"),
        ("batch_size", 2.5, "batch_size must be an integer >= 1, got 2.5"),
        ("lr", -1e-3, "lr must be a number > 0"),
        ("warmup", -1, "warmup must be an integer >= 0"),
        ("eval_every", 0, "eval_every must be an integer >= 1"),
        ("grad_clip", -1.0, "grad_clip must be a number >= 0"),
        ("device", "tpu", "unknown device 'tpu'"),
    ],
)
def test_bad_arguments_are_named(corpus, argument, value, message):
    with pytest.raises(ValueError, match=message):
        md.train(md.GPTConfig(**TINY), corpus[0], **{"steps": 2, argument: value}, progress=False)


def test_bad_data_is_named():
    with pytest.raises(ValueError, match="data has 17 tokens; training needs more than block_size \\+ 1 = 17"):
        md.train(md.GPTConfig(**TINY), torch.zeros(17, dtype=torch.long), steps=1, device="cpu", progress=False)
    with pytest.raises(ValueError, match=r"tokens in \[300, 300\], outside \[0, vocab_size=256\)"):
        md.train(md.GPTConfig(**TINY), torch.full((100,), 300), steps=1, device="cpu", progress=False)
    with pytest.raises(TypeError, match="1-D integer token tensor"):
        md.train(md.GPTConfig(**TINY), torch.rand(100), steps=1, device="cpu", progress=False)
    with pytest.raises(ValueError, match="unknown corpus"):
        md.train(md.GPTConfig(**TINY), "no_such_corpus", steps=1, device="cpu", progress=False)
    with pytest.raises(ValueError, match="data has 0 tokens"):
        md.train(md.GPTConfig(**TINY), torch.zeros(0, dtype=torch.long), steps=1, device="cpu", progress=False)


# ----------------------------------------------------------------------------- runs are never lost


def quick_run(out, data, **overrides):
    settings = dict(steps=2, batch_size=2, device="cpu", progress=False, out=out)
    return md.train(overrides.pop("cfg", md.GPTConfig(**TINY)), data, **{**settings, **overrides})


def test_a_folder_holding_a_checkpoint_is_refused_unless_resume_or_overwrite(corpus, tmp_path):
    train_tokens, _ = corpus
    quick_run(tmp_path, train_tokens)
    first = (tmp_path / CHECKPOINT_NAME).read_bytes()
    other = md.GPTConfig(**TINY, pe="alibi")
    with pytest.raises(ValueError, match="already holds a checkpoint; pass resume=True .* or overwrite=True"):
        quick_run(tmp_path, train_tokens, cfg=other)
    assert (tmp_path / CHECKPOINT_NAME).read_bytes() == first  # the first run is still there
    with pytest.raises(ValueError, match="resume and overwrite exclude each other"):
        quick_run(tmp_path, train_tokens, cfg=None, resume=True, overwrite=True)
    quick_run(tmp_path / "other", train_tokens, cfg=other)
    with pytest.raises(ValueError, match="already holds a checkpoint"):  # resuming another run into this folder
        quick_run(tmp_path, train_tokens, cfg=None, steps=3, resume=tmp_path / "other" / CHECKPOINT_NAME)
    assert (tmp_path / CHECKPOINT_NAME).read_bytes() == first
    quick_run(tmp_path, train_tokens, cfg=None, steps=3, resume=tmp_path / CHECKPOINT_NAME)  # its own: fine
    quick_run(tmp_path, train_tokens, cfg=other, overwrite=True)
    assert read_checkpoint(tmp_path)["config"]["pe"] == "alibi"


def test_a_bad_out_is_named_before_the_first_step(corpus, tmp_path):
    train_tokens, _ = corpus
    drawn = []

    def batches(step, generator):  # counts the steps that started
        drawn.append(step)
        return get_batch(train_tokens, 2, TINY["block_size"], generator)

    (tmp_path / "notes.txt").write_text("a file")
    with pytest.raises(ValueError, match="out='.*notes.txt' is a file, not a folder"):
        quick_run(tmp_path / "notes.txt", batches)
    with pytest.raises(ValueError, match="cannot be created: '.*notes.txt' is a file"):
        quick_run(tmp_path / "notes.txt" / "run", batches)
    if os.geteuid() != 0:  # root writes anywhere: a read-only folder only stops other users
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="is not writable"):
            quick_run(locked / "run", batches)
    assert drawn == [] and sorted(os.listdir(tmp_path)) == ["locked", "notes.txt"][os.geteuid() == 0 :]


def test_an_interrupted_run_keeps_its_checkpoint_and_says_how_to_resume(corpus, tmp_path):
    train_tokens, _ = corpus

    def batches(step, generator):
        if step == 5 and not resumed:
            raise KeyboardInterrupt
        return get_batch(train_tokens, 2, TINY["block_size"], generator)

    resumed = False
    with pytest.raises(
        train_module.TrainingInterrupted,
        match=r"interrupted at step 5; .*checkpoint.pt holds step 4: continue it with resume=True",
    ):
        quick_run(tmp_path, batches, steps=8, checkpoint_every=2)
    assert read_checkpoint(tmp_path)["step"] == 4
    resumed = True
    _, history = quick_run(tmp_path, batches, cfg=None, steps=8, resume=True, log_every=1)
    assert [entry["step"] for entry in history] == list(range(9))
    with pytest.raises(train_module.TrainingInterrupted, match="before its first checkpoint; nothing was saved"):
        resumed = False
        quick_run(tmp_path / "other", batches, steps=8)
    assert not (tmp_path / "other").exists()


class NaNAfter(md.GPT):
    """A GPT whose training loss turns NaN from its `poisoned_call`-th forward pass on."""

    def __init__(self, cfg, poisoned_call):
        super().__init__(cfg)
        self.calls, self.poisoned_call = 0, poisoned_call

    def forward(self, idx, targets=None):
        logits, loss = super().forward(idx, targets)
        self.calls += 1
        return logits, loss * math.nan if self.calls > self.poisoned_call else loss


def test_the_first_non_finite_loss_stops_training_before_the_checkpoint(corpus, tmp_path):
    train_tokens, _ = corpus
    torch.manual_seed(0)
    model = NaNAfter(md.GPTConfig(**TINY), poisoned_call=3)  # steps 0, 1, 2 are fine, step 3 is NaN
    with pytest.raises(FloatingPointError) as error:
        quick_run(tmp_path, train_tokens, cfg=model, steps=10, checkpoint_every=2)
    message = str(error.value)
    assert "stopped at step 3: non-finite loss nan; the last finite loss was " in message
    assert "at step 2; " in message and "(step 2) is untouched" in message and "learning rate" in message
    assert "\n" not in message
    saved = read_checkpoint(tmp_path)
    assert saved["step"] == 2 and all(torch.isfinite(tensor).all() for tensor in saved["model"].values())
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the NaN never reached the weights


def test_a_non_finite_loss_between_logging_steps_leaves_the_weights_as_they_were_before_it(corpus):
    """Read at the next logging step (8), the NaN of step 5 is reported as step 5's; its update and the two
    after it were skipped on the device, so the weights are those that step 5 started from."""
    train_tokens, _ = corpus
    torch.manual_seed(0)
    model = NaNAfter(md.GPTConfig(**TINY), poisoned_call=5)
    before_nan = {}
    model.register_forward_pre_hook(
        lambda module, args: before_nan.update(
            {} if module.calls != 5 else {key: value.clone() for key, value in module.state_dict().items()}
        )
    )
    with pytest.raises(
        FloatingPointError,
        match=r"stopped at step 5: non-finite loss nan; the last finite loss "
        r"was \d\.\d{4} at step 4",
    ):
        quick_run(None, train_tokens, cfg=model, steps=12, log_every=4)
    assert model.calls == 9  # steps 0-8 ran; step 8 logs, reads the health of 5-8, and stops
    assert state_equal(model.state_dict(), before_nan)


def test_a_non_finite_gradient_stops_training_too(corpus):
    train_tokens, _ = corpus
    model = md.GPT(md.GPTConfig(**TINY))
    step = {"count": 0}

    def poison(grad):  # the loss stays finite; the gradient of one matrix turns inf at the third backward
        step["count"] += 1
        return grad * math.inf if step["count"] == 3 else grad

    model.lm_head.weight.register_hook(poison)
    with pytest.raises(FloatingPointError, match="stopped at step 2: non-finite gradient norm"):
        quick_run(None, train_tokens, cfg=model, steps=5)
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ----------------------------------------------------------------------------- host synchronisations

# What reads a tensor's value into Python. On a GPU each one waits for every queued kernel (a host sync); on the
# CPU they cost nothing, but the same calls run on both, so counting them here counts the GPU's syncs.
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


def count_host_reads(monkeypatch) -> list[str]:
    """A list that fills with `file:line name` for every host read made by minidape's own code (torch's
    internals, e.g. a CPU optimizer's step counter, are not minidape's to change)."""
    package = str(Path(md.__file__).resolve().parent)
    reads = []
    for name in HOST_READS:
        # the defaults bind this iteration's method and name
        def counted(self, *args, _original=getattr(torch.Tensor, name), _name=name, **kwargs):  # noqa: B008
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(package):
                reads.append(f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno} {_name}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


# one of each kind of encoding (rotary, bias, absolute) and each fast kernel
SYNC_FREE_MODELS = [("rope", "none"), ("kerple_log", "dape"), ("learned", "none"), ("t5", "conv"), ("fire", "dape_add")]


@pytest.mark.parametrize("pe, refiner", SYNC_FREE_MODELS)
def test_training_steps_between_logs_read_nothing_on_the_host(corpus, monkeypatch, pe, refiner):
    """No per-step sync: the checks that read values run on the first step (the data's range was checked up
    front), the non-finite check is read at the next logging step. Logging steps (here 0 and the last) may
    read; the steps between them read nothing."""
    train_tokens, _ = corpus
    reads = count_host_reads(monkeypatch)
    reads_before_step = []
    draw_batch = train_module._draw_batch

    def counting_draw(*args, **kwargs):
        reads_before_step.append(len(reads))
        return draw_batch(*args, **kwargs)

    monkeypatch.setattr(train_module, "_draw_batch", counting_draw)
    # This CPU run stands in for a GPU's step, so it takes the GPU's path: the fast forms that read positions on
    # the host (fast_encodings: FIRE's threshold test, the test for consecutive positions that lets a bias of the
    # distance alone be one row of distances) run on the CPU only, where such a read costs no sync.
    monkeypatch.setattr(fast_encodings, "fire_bias", lambda *args: None)
    monkeypatch.setattr(fast_encodings, "_consecutive", lambda positions: False)
    steps = 6
    md.train(
        md.GPTConfig(**TINY, pe=pe, refiner=refiner),
        train_tokens,
        steps=steps,
        batch_size=4,
        log_every=steps,
        device="cpu",
        progress=False,
    )
    assert len(reads_before_step) == steps + 1
    first, last = reads_before_step[2], reads_before_step[steps]  # from the start of step 2 to the final entry
    per_step = (last - first) / (steps - 2)
    print(f"{pe}+{refiner}: {per_step:g} host reads per step between logs")
    assert reads[first:last] == [], f"{per_step:g} reads per step: {reads[first:last][:8]}"


# ----------------------------------------------------------------------------- the corpus of a run


def test_resume_refuses_a_corpus_other_than_the_one_trained_on(corpus, tmp_path, monkeypatch):
    """A relative path names another file in another folder; an edited file is another corpus."""
    text = bytes(corpus[0][:20_000].tolist())
    for folder, content in (("a", text), ("b", text[::-1])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "books.txt").write_bytes(content)
    monkeypatch.chdir(tmp_path / "a")
    quick_run(tmp_path / "run", "books.txt", checkpoint_every=1, steps=4, eval_windows=1)
    recorded = read_checkpoint(tmp_path / "run")["corpus"]
    assert recorded["path"] == str(tmp_path / "a" / "books.txt") and recorded["size"] == len(text)

    monkeypatch.chdir(tmp_path / "b")  # the same relative name is another file here
    with pytest.raises(ValueError, match=r"the corpus is .*b/books.txt .* but the run was trained on .*a/books.txt"):
        quick_run(tmp_path / "run", "books.txt", cfg=None, steps=6, resume=True)
    _, history = quick_run(tmp_path / "run", None, cfg=None, steps=6, resume=True, eval_windows=1)  # its own
    assert history[-1]["step"] == 6

    (tmp_path / "a" / "books.txt").write_bytes(text[:-1])  # edited after training
    with pytest.raises(ValueError, match=r"is .*a/books.txt \(19999 bytes.* trained on .*a/books.txt \(20000 bytes"):
        quick_run(tmp_path / "run", None, cfg=None, steps=8, resume=True)


def test_a_batch_function_trains_with_adam_and_reports_metrics(corpus):
    train_tokens, _ = corpus

    def batches(step, generator):
        return get_batch(train_tokens, 3, TINY["block_size"], generator)

    def metrics(logits, inputs, targets):
        return {"accuracy": (logits.argmax(-1) == targets).float().mean().item(), "width": inputs.shape[1]}

    runs = [
        md.train(
            md.GPTConfig(**TINY),
            batches,
            steps=4,
            optimizer="adam",
            metrics=metrics,
            log_every=2,
            device="cpu",
            progress=False,
            seed=seed,
        )
        for seed in (1, 1, 2)
    ]
    (model, history), (again, _), (other, _) = runs
    assert [entry["step"] for entry in history] == [0, 2, 4]
    assert all(0 <= entry["accuracy"] <= 1 and entry["width"] == TINY["block_size"] for entry in history)
    assert state_equal(model.state_dict(), again.state_dict())  # the generator is seeded per step
    assert not state_equal(model.state_dict(), other.state_dict())
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'; valid choices: adamw, adam"):
        md.train(md.GPTConfig(**TINY), batches, steps=1, optimizer="sgd", progress=False)
    with pytest.raises(TypeError, match=r"must return a tuple \(inputs, targets\) of tensors, got list"):
        md.train(md.GPTConfig(**TINY), lambda step, generator: [1, 2], steps=1, device="cpu", progress=False)


# ----------------------------------------------------------------------------- DDP

DDP_SETTINGS = dict(steps=3, batch_size=4, lr=1e-2, warmup=1, seed=7)
DDP_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import minidape as md

    out, settings = sys.argv[1], json.loads(sys.argv[2])
    tokens = md.load_corpus("austen")[:50_000]
    model, history = md.train(md.GPTConfig(**settings.pop("config")), tokens, device="cpu", out=out,
                              progress=False, **settings)
    torch.save({"model": model.state_dict(), "history": history}, os.path.join(out, f"rank{os.environ['RANK']}.pt"))
""")


def reference_weights(cfg: md.GPTConfig, tokens: torch.Tensor, ranks) -> dict:
    """One process doing what DDP should do: each step, the batches of all `ranks` together in one mean loss.

    Written out plainly from the recipe (AdamW 0.9/0.95, decay on matrices only, warmup + cosine, clip at 1).
    """
    steps, batch_size, lr, warmup, seed = (DDP_SETTINGS[key] for key in ("steps", "batch_size", "lr", "warmup", "seed"))
    seed_everything(seed)
    model = md.GPT(cfg)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        betas=(0.9, 0.95),
    )
    for step in range(steps):
        batches = [
            get_batch(tokens, batch_size, cfg.block_size, torch.Generator().manual_seed(step_seed(seed, rank, step)))
            for rank in ranks
        ]
        x, y = (torch.cat(parts) for parts in zip(*batches))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, lr / 10, warmup)
        model(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


def fake_torchrun(monkeypatch, gpus: int, local_rank: int, processes: int = 2) -> dict:
    """torchrun's environment for one rank on a machine showing `gpus` GPUs; records the backend and the GPU
    that `setup_distributed` would join with, without joining anything."""
    joined = {}
    monkeypatch.setenv("WORLD_SIZE", str(processes))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    monkeypatch.setenv("RANK", str(local_rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: joined.setdefault("gpu", device))
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend: joined.setdefault("backend", backend))
    return joined


@pytest.mark.parametrize("local_rank", [0, 1])
def test_ddp_on_a_one_gpu_machine_trains_every_rank_on_the_cpu_with_gloo(monkeypatch, capsys, local_rank):
    """The README's `torchrun --nproc_per_node=2` on a machine with one GPU: rank 1 has no GPU of its own, and
    the ranks must agree on one backend, so both use gloo on the CPU; rank 0 says why, in one line."""
    joined = fake_torchrun(monkeypatch, gpus=1, local_rank=local_rank)
    context, device = distributed.setup_distributed("auto")
    assert (context.rank, context.world_size) == (local_rank, 2)
    assert device == torch.device("cpu") and joined == {"backend": "gloo"}
    said = capsys.readouterr().err.strip().splitlines()
    if local_rank == 0:
        assert len(said) == 1 and "2 processes" in said[0] and "1 GPU" in said[0] and "gloo" in said[0]
    else:
        assert said == []


def test_ddp_with_a_gpu_per_rank_uses_nccl_and_an_explicit_cuda_without_one_is_refused(monkeypatch, capsys):
    joined = fake_torchrun(monkeypatch, gpus=2, local_rank=1)
    _, device = distributed.setup_distributed("auto")
    assert device == torch.device("cuda", 1) and joined == {"gpu": device, "backend": "nccl"}
    assert capsys.readouterr().err == ""
    fake_torchrun(monkeypatch, gpus=1, local_rank=0)
    with pytest.raises(ValueError, match=r"2 processes on this machine, 1 GPU\(s\) visible.*--nproc_per_node=1"):
        distributed.setup_distributed("cuda")
    joined = fake_torchrun(monkeypatch, gpus=0, local_rank=1)
    assert distributed.setup_distributed("cpu")[1] == torch.device("cpu") and joined == {"backend": "gloo"}


def test_ddp_two_cpu_processes_under_torchrun(tmp_path):
    # No refiner here: the last bias of a refiner shifts whole score rows, which softmax ignores, so its exact
    # gradient is 0 and Adam turns the rounding noise of two summation orders into full-size steps.
    cfg = md.GPTConfig(**TINY, pe="kerple_log")
    script = tmp_path / "ddp_train.py"
    script.write_text(DDP_SCRIPT)
    settings = json.dumps({**DDP_SETTINGS, "config": cfg.__dict__})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(script),
            str(tmp_path),
            settings,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"torchrun, 2 processes: {time.perf_counter() - started:.1f} s")

    rank0, rank1 = (torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1))
    assert state_equal(rank0["model"], rank1["model"])  # both ranks end with identical weights
    assert rank0["history"] == rank1["history"]  # the logged loss is averaged over ranks
    saved = read_checkpoint(tmp_path)  # rank 0 wrote the checkpoint, and only it
    assert state_equal(saved["model"], rank0["model"]) and sorted(os.listdir(tmp_path)) == [
        CHECKPOINT_NAME,
        "ddp_train.py",
        "rank0.pt",
        "rank1.pt",
    ]

    tokens = md.load_corpus("austen")[:50_000]
    both = reference_weights(cfg, tokens, ranks=(0, 1))
    rank0_alone = reference_weights(cfg, tokens, ranks=(0,))
    gap = max((rank0["model"][key] - both[key]).abs().max().item() for key in both)
    gap_alone = max((rank0["model"][key] - rank0_alone[key]).abs().max().item() for key in both)
    assert gap < 1e-5  # DDP averaged the gradients of both ranks' batches
    assert gap_alone > 100 * max(gap, 1e-7)  # ...and rank 1's batches really counted
