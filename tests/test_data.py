"""Corpora as byte tokens: bundled names, .txt/.gz paths, the 90/10 split, windows and errors."""

import gzip
import os

import pytest
import torch

import minidape as md
from minidape.lab.data import CORPORA, DATA_DIR, fixed_windows, get_batch


def raw_bytes(name: str) -> bytes:
    """The corpus read independently of load_corpus: its gzip files decompressed and joined in order."""
    return b"".join(gzip.decompress((DATA_DIR / file).read_bytes()) for file in CORPORA[name])


@pytest.mark.parametrize("name", ["austen", "latex", "python"])
def test_bundled_corpus_is_its_bytes_split_90_10(name):
    expected = torch.tensor(list(raw_bytes(name)), dtype=torch.uint8)
    train, val = md.load_corpus(name, "train"), md.load_corpus(name, "val")
    assert train.dtype == val.dtype == torch.uint8 and train.dim() == val.dim() == 1
    assert len(val) == len(expected) // 10  # the last 10%, rounded down
    assert torch.equal(torch.cat([train, val]), expected)  # disjoint and complete, in order
    assert torch.equal(md.load_corpus(name), train)  # split defaults to train


def test_text_and_gzip_paths(tmp_path):
    text = bytes(range(256)) * 3 + "extrapolation ünïcode".encode()
    plain, packed = tmp_path / "notes.txt", tmp_path / "notes.txt.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    cut = len(text) - len(text) // 10
    for path in (plain, packed, str(plain)):
        assert md.load_corpus(path, "train").tolist() == list(text[:cut])
        assert md.load_corpus(path, "val").tolist() == list(text[cut:])


def test_split_is_deterministic_and_returns_copies():
    first = md.load_corpus("latex", "val")
    first[:10] = 0  # callers may modify what they get without touching the cache
    again = md.load_corpus("latex", "val")
    assert torch.equal(again, md.load_corpus("latex", "val"))
    assert not torch.equal(first, again)


def test_changed_file_is_read_again(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"a" * 100)
    assert set(md.load_corpus(path).tolist()) == {ord("a")}
    path.write_bytes(b"b" * 120)
    assert set(md.load_corpus(path).tolist()) == {ord("b")}


def test_errors_name_the_valid_choices(tmp_path):
    with pytest.raises(ValueError, match="unknown corpus 'books'.*austen, latex, python"):
        md.load_corpus("books")
    with pytest.raises(FileNotFoundError, match="missing.txt.*austen, latex, python"):
        md.load_corpus(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="unknown split 'test'.*train, val"):
        md.load_corpus("austen", "test")
    with pytest.raises(TypeError, match="corpus name"):
        md.load_corpus(42)
    broken = tmp_path / "broken.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="cannot read corpus file"):
        md.load_corpus(broken)
    tiny = tmp_path / "tiny.txt"
    tiny.write_bytes(b"x")
    with pytest.raises(ValueError, match="1 bytes"):
        md.load_corpus(tiny)


def test_get_batch_draws_contiguous_windows_and_their_next_tokens():
    tokens = torch.arange(50)
    x, y = get_batch(tokens, batch_size=400, block_size=8, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (400, 8) and x.dtype == torch.long
    starts = x[:, 0]
    assert torch.equal(x, starts[:, None] + torch.arange(8))  # a contiguous slice of the stream
    assert torch.equal(y, x + 1)  # targets are the next tokens
    assert starts.min() == 0 and starts.max() == 50 - 9  # every valid start can be drawn, none beyond
    again, _ = get_batch(tokens, 400, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, again)


def test_fixed_windows_depend_on_the_seed_alone():
    tokens = torch.arange(1000)
    windows = fixed_windows(tokens, width=17, count=5, seed=3)
    assert windows.shape == (5, 17)
    assert torch.equal(windows, windows[:, :1] + torch.arange(17))
    torch.manual_seed(123)  # the global generator plays no part
    assert torch.equal(windows, fixed_windows(tokens, 17, 5, seed=3))
    assert not torch.equal(windows, fixed_windows(tokens, 17, 5, seed=4))


def test_windows_longer_than_the_data_are_an_error():
    with pytest.raises(ValueError, match="windows of 11 tokens.*only 10"):
        get_batch(torch.arange(10), 2, 10)
    with pytest.raises(ValueError, match="windows of 12 tokens.*only 10"):
        fixed_windows(torch.arange(10), 12, 1)


def test_provenance_lists_every_bundled_file():
    provenance = (DATA_DIR / "PROVENANCE.md").read_text()
    for name, files in CORPORA.items():
        assert f"`{name}`" in provenance
        for file in files:
            assert os.path.exists(DATA_DIR / file)
    assert (DATA_DIR / "code" / "PSF_LICENSE.txt").exists() and (DATA_DIR / "latex" / "MANIFEST.tsv").exists()
