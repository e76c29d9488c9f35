"""Files in and out: an output is written whole or not at all, never over something that is not a
regular file; an input file that is malformed is one sentence, never a traceback.

The tests run as root, which ignores permissions, so a full disk, a read-only file system or
a refused permission is injected where the write happens (an ``OSError`` with that errno), and
every test checks what is left on disk afterwards: the old file untouched, no temporary file.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zero_sim.calibration import (
    Calibration,
    CalibrationError,
    CollectiveFit,
    ComputeCalibration,
    CpuCalibration,
    fit_nccl_tests_text,
)
from zero_sim.cli import main
from zero_sim.system.collectives import CollectiveError
from zero_sim.system.nccl_tests import MAX_BUSBW, fit_nccl_tests, parse_nccl_tests
from zero_sim.system.topology import PRESETS
from zero_sim.vocabulary import files
from zero_sim.vocabulary.files import (
    InputPathError,
    OutputPathError,
    atomic_output,
    read_text_input,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)

DATA = Path(__file__).parent / "data"
FUZZ_EXAMPLES = int(os.environ.get("ZERO_SIM_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SIMULATE = ["simulate", "--model", "gpt2-124m", "--gpus", "2", "--topology", "pcie"]


def one_sentence(message: str) -> bool:
    return "\n" not in message.strip() and "Traceback" not in message and len(message) < 400


def leftovers(directory: Path) -> list[str]:
    """Temporary files a writer left beside its target."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# ----------------------------------------------------------------------------- what is at the target

def test_a_symlink_at_the_target_is_refused_and_the_file_it_points_to_is_untouched(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    link = tmp_path / "trace.json"
    link.symlink_to(precious)
    with pytest.raises(OutputPathError, match="symbolic link") as err:
        write_json_atomic(link, {"traceEvents": []})
    assert one_sentence(str(err.value))
    assert link.is_symlink() and precious.read_text() == "keep me"
    assert leftovers(tmp_path) == []


def test_a_dangling_symlink_is_refused_too_and_nothing_is_created_where_it_points(tmp_path):
    link = tmp_path / "plot.png"
    link.symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(OutputPathError, match="symbolic link"):
        write_bytes_atomic(link, b"png")
    assert not (tmp_path / "nowhere.png").exists() and link.is_symlink()


def test_a_directory_at_the_target_is_refused(tmp_path):
    (tmp_path / "out.json").mkdir()
    with pytest.raises(OutputPathError, match="is a directory") as err:
        write_text_atomic(tmp_path / "out.json", "{}")
    assert one_sentence(str(err.value))
    assert (tmp_path / "out.json").is_dir() and leftovers(tmp_path) == []


def test_a_fifo_at_the_target_is_refused_without_blocking_on_it(tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    with pytest.raises(OutputPathError, match="FIFO"):
        write_json_atomic(fifo, {})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and leftovers(tmp_path) == []


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_a_device_node_is_refused_before_anything_is_written_beside_it():
    # Renaming over /dev/null as root would replace the device node; the check comes first.
    before = os.lstat("/dev/null")
    with pytest.raises(OutputPathError, match="is a device"):
        write_bytes_atomic("/dev/null", b"x")
    after = os.lstat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


def test_a_file_on_the_way_to_the_target_is_refused(tmp_path):
    (tmp_path / "out").write_text("a file, not a directory")
    with pytest.raises(OutputPathError, match="not a directory") as err:
        write_json_atomic(tmp_path / "out" / "trace.json", {})
    assert one_sentence(str(err.value)) and (tmp_path / "out").read_text() == "a file, not a directory"


# ----------------------------------------------------------------------------- a write that succeeds

def test_a_missing_parent_is_created_and_the_file_is_readable_like_any_other(tmp_path):
    target = tmp_path / "a" / "b" / "run.json"
    write_json_atomic(target, {"ok": True})
    assert json.loads(target.read_text()) == {"ok": True}
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # not the temporary file's 0600
    assert leftovers(target.parent) == []


def test_replacing_a_file_keeps_its_permissions(tmp_path):
    target = tmp_path / "cal.json"
    target.write_text("old")
    target.chmod(0o640)
    write_text_atomic(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_text_is_utf8_and_only_whole_new_files_can_be_opened(tmp_path):
    write_text_atomic(tmp_path / "t.txt", "µs")
    assert (tmp_path / "t.txt").read_bytes() == "µs".encode()
    with pytest.raises(ValueError, match="mode must be"), atomic_output(tmp_path / "t.txt", "a"):
        pass


# ----------------------------------------------------------------------------- a write that fails

def failing(errnum: int):
    def fail(*_args, **_kwargs):
        raise OSError(errnum, os.strerror(errnum))
    return fail


@pytest.mark.parametrize("where,errnum,words", [
    ("fsync", errno.ENOSPC, "no space left on device; free space or choose another path"),
    ("fsync", errno.EDQUOT, "disk quota exceeded"),
    ("fsync", errno.EIO, "an input/output error occurred"),
    ("replace", errno.EROFS, "the file system is read-only"),
    ("replace", errno.EACCES, "permission denied"),
    ("fchmod", errno.EPERM, "operation not permitted"),
    ("mkstemp", errno.EACCES, "permission denied"),
    ("mkstemp", errno.ENOSPC, "no space left on device"),
])
def test_a_failed_write_is_one_sentence_and_leaves_the_old_file_and_nothing_else(
        tmp_path, monkeypatch, where, errnum, words):
    target = tmp_path / "trace.json"
    target.write_text("old")
    before = sorted(p.name for p in tmp_path.iterdir())
    owner = files.tempfile if where == "mkstemp" else files.os
    monkeypatch.setattr(owner, where, failing(errnum))
    with pytest.raises(OutputPathError) as err:
        write_json_atomic(target, {"traceEvents": list(range(1000))})
    monkeypatch.undo()
    assert str(err.value).startswith(f"cannot write {target}: {words}")
    assert one_sentence(str(err.value))
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_full_disk_in_the_middle_of_a_write_leaves_no_file_at_all(tmp_path):
    target = tmp_path / "new.png"
    with pytest.raises(OutputPathError, match="no space left on device"), atomic_output(target) as f:
        f.write(b"\x89PNG half a picture")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_write_keeps_the_old_file_and_lets_the_interrupt_through(tmp_path):
    target = tmp_path / "run.json"
    target.write_text('{"old": 1}')
    with pytest.raises(KeyboardInterrupt), atomic_output(target, "w") as f:
        f.write('{"new": ')
        raise KeyboardInterrupt
    assert target.read_text() == '{"old": 1}' and leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- reading a file

def test_an_input_that_is_missing_a_directory_or_a_fifo_is_one_sentence(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "dir").mkdir()
    for name, words in (("absent", "does not exist"), ("dir", "is a directory"), ("pipe", "FIFO")):
        with pytest.raises(InputPathError, match=words) as err:
            read_text_input(tmp_path / name, "nccl-tests file")
        assert one_sentence(str(err.value)) and "nccl-tests file" in str(err.value)


# ----------------------------------------------------------------------------- through the command line

@pytest.mark.parametrize("flag", ["--trace", "--plot"])
def test_the_cli_refuses_a_symlink_or_a_directory_as_trace_or_plot_with_one_line(tmp_path, capsys, flag):
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    suffix = ".json" if flag == "--trace" else ".png"
    link, directory = tmp_path / f"link{suffix}", tmp_path / f"dir{suffix}"
    link.symlink_to(precious)
    directory.mkdir()
    for target, words in ((link, "symbolic link"), (directory, "directory")):
        assert main([*SIMULATE, flag, str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and one_sentence(err) and err.startswith("zero-sim: cannot write")
    assert precious.read_text() == "keep me" and link.is_symlink() and directory.is_dir()
    assert leftovers(tmp_path) == [] and leftovers(directory) == []


def test_the_cli_says_a_full_disk_in_one_line_and_leaves_no_picture_or_trace(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(files.os, "fsync", failing(errno.ENOSPC))
    for flag, name in (("--plot", "t.png"), ("--trace", "t.json")):
        assert main([*SIMULATE, flag, str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"zero-sim: cannot write {tmp_path / name}: no space left on device; " \
                      f"free space or choose another path"
    assert list(tmp_path.iterdir()) == []


def test_the_cli_says_where_it_wrote_and_refuses_a_picture_format_it_cannot_write(tmp_path, capsys):
    trace, plot = tmp_path / "deep" / "t.json", tmp_path / "deep" / "t.png"
    (tmp_path / "deep").mkdir()  # a directory that is not there is refused, not created
    assert main([*SIMULATE, "--json", "--trace", str(trace), "--plot", str(plot)]) == 0
    out = capsys.readouterr()
    json.loads(out.out)  # stdout stays one JSON object
    assert f"wrote trace to {trace}" in out.err and f"to {plot}" in out.err
    assert trace.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"
    assert main([*SIMULATE, "--plot", str(tmp_path / "t.txt")]) == 2
    assert "not a picture format" in capsys.readouterr().err


def test_fit_and_demo_refuse_paths_they_cannot_use_in_one_line(tmp_path, capsys):
    (tmp_path / "table").mkdir()
    (tmp_path / "afile").write_text("x")
    for argv, words in ((["fit-nccl-tests", str(tmp_path / "table")], "is a directory"),
                        (["fit-nccl-tests", str(tmp_path / "absent")], "does not exist"),
                        (["demo", "--out", str(tmp_path / "afile")], "not a directory")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and one_sentence(err)


# ----------------------------------------------------------------------------- calibration files

def full_calibration() -> Calibration:
    """A calibration with every section filled, so every field gets mutated."""
    sizes = tuple(4096 << i for i in range(10))
    fits = {k: CollectiveFit(k, 2, 1e-4, 20e9, 0.02, sizes, tuple(1e-4 + s / 20e9 for s in sizes))
            for k in ("all_reduce", "reduce_scatter", "all_gather")}
    compute = ComputeCalibration({"embedding": {"fwd": 1e-3, "bwd": 2e-3},
                                  "block": {"fwd": 10e-3, "bwd": 20e-3},
                                  "head": {"fwd": 5e-3, "bwd": 10e-3}}, 4096, 1e-8, 2, 2, 1.1, "small", 1.05)
    cpu = CpuCalibration(2e-4, 0.1, 2, 2, 2e-4, 0.1, 0.5)
    return Calibration(fits, compute, "nccl", {"host": "test", "cores": 2}, PRESETS["dgx-h100"], cpu)


def paths(node, prefix=()):
    """Every key path into a JSON object, containers included."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*prefix, i))
    return out


VALID = full_calibration().to_dict()
PATHS = paths(VALID)
MUTATIONS = ["delete", "unknown key", "text", "all_to_all", "Z100", True, None, [], [1, 2], {}, {"x": 1},
             0, -1, 1, 2.5, -0.0, 1e-300, 1e308, 10**400, math.nan, math.inf, -math.inf, [math.nan]]


def mutated(path, mutation):
    d = json.loads(json.dumps(VALID))
    *parents, last = path
    holder = d
    for key in parents:
        holder = holder[key]
    if mutation == "delete":
        holder.pop(last)
    elif mutation == "unknown key":
        if isinstance(holder, dict):
            holder[f"{last}_typo"] = holder[last]
    else:
        holder[last] = mutation
    return d


def test_a_full_calibration_survives_its_own_file(tmp_path):
    cal = full_calibration()
    cal.save(tmp_path / "cal.json")
    assert Calibration.load(tmp_path / "cal.json") == cal


@FUZZ
@given(path=st.sampled_from(PATHS), mutation=st.sampled_from(MUTATIONS))
def test_a_calibration_with_one_field_mutated_loads_or_is_one_calibration_error(path, mutation):
    d = mutated(path, mutation)
    try:
        cal = Calibration.from_dict(d, "'cal.json'")
    except CalibrationError as exc:
        assert one_sentence(str(exc)) and str(exc).startswith("'cal.json'")
        return
    # What loads is usable: its figures are finite and it reads back from its own file.
    for fit in cal.collectives.values():
        assert math.isfinite(fit.time(1 << 20)) and math.isfinite(fit.alone_time(4 << 20))
    assert Calibration.from_dict(cal.to_dict()) == cal
    cal.describe()


@pytest.mark.parametrize("mutation,words", [
    (("topology", "gpu", "Z100"), "topology.gpu 'Z100', which is not one of 'V100'"),
    (("topology", "fabric", "kind", "nvlink"), "which is not one of 'nvswitch', 'pcie' or 'loopback'"),
    (("topology", "network", "nics", 0), "topology.network.nics 0, which must be at least 1"),
    (("collectives", "all_reduce", "sizes", [[4096]]), "collectives.all_reduce.sizes[0]"),
    (("collectives", "all_reduce", "latency_s", math.nan), "must be a finite number"),
    (("compute", "tokens", -1), "compute.tokens -1, which must be at least 1"),
    (("cpu", "overlap_slowdown", math.inf), "cpu.overlap_slowdown inf"),
])
def test_each_kind_of_bad_field_is_named_in_the_sentence(mutation, words):
    *path, value = mutation
    with pytest.raises(CalibrationError) as err:
        Calibration.from_dict(mutated(tuple(path), value))
    assert words in str(err.value) and one_sentence(str(err.value))


def test_a_calibration_that_cannot_be_read_back_is_not_written(tmp_path):
    cal = full_calibration()
    bad = Calibration({"all_reduce": CollectiveFit("all_reduce", 2, math.nan, 1e9, 0.0)}, None, "nccl")
    with pytest.raises(CalibrationError, match="finite"):
        bad.save(tmp_path / "cal.json")
    assert list(tmp_path.iterdir()) == []
    cal.save(tmp_path / "cal.json")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(CalibrationError, match="is a directory"):
        Calibration.load(tmp_path / "dir.json")


# ----------------------------------------------------------------------------- nccl-tests tables

def test_one_garbled_time_is_refused_naming_its_line_instead_of_shifting_columns(data_dir):
    # Reported: "13,6x8" in the time column made the parser read algbw as the time, busbw as
    # algbw..., and the fit claimed a bus bandwidth no link has.
    text = (data_dir / "seed002_pcie_pair.txt").read_text().replace("13,698 19.60", "13,6x8 19.60")
    with pytest.raises(CollectiveError, match="line 8 of the nccl-tests output has '13,6x8'") as err:
        parse_nccl_tests(text)
    assert one_sentence(str(err.value))
    with pytest.raises(CalibrationError, match="line 8"):
        fit_nccl_tests_text(text)


def test_a_digit_lost_from_a_time_is_caught_by_algbw_being_size_over_time(data_dir):
    text = (data_dir / "seed002_pcie_pair.txt").read_text().replace("947.6", "94.6")
    with pytest.raises(CollectiveError, match="line 4 .* algbw 17.71 GB/s, but its size over its time"):
        parse_nccl_tests(text)


NATIVE = (
    "#   nranks 8\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
    "     1048576        262144     float     sum      -1    60.12   17.44   30.52      0"
    "    59.80   17.53   30.68      0\n"
    "     4194304       1048576     float     sum      -1    98.40   42.63   74.60      0"
    "    97.90   42.84   74.97      0\n"
    "    16777216       4194304     float     sum      -1   205.10   81.80  143.15      0"
    "   204.30   82.12  143.71    N/A\n"
)


def test_native_rows_are_read_by_their_layout_whatever_their_check_column_says():
    table = parse_nccl_tests(NATIVE)
    assert [r.time_us for r in table.rows] == [60.12, 98.40, 205.10] and table.n_ranks == 8
    with pytest.raises(CollectiveError, match="line 4 .* columns"):
        parse_nccl_tests(NATIVE.replace("98.40   42.63", "98.40 42.63 7"))


def test_a_fit_beyond_any_link_is_refused(data_dir):
    table = parse_nccl_tests((data_dir / "seed002_pcie_pair.txt").read_text())
    flat = table.__class__(tuple(r.__class__(r.size_bytes, 580.2, r.algbw_gbps, r.busbw_gbps)
                                 for r in table.rows), table.n_ranks, table.factor)
    with pytest.raises(CollectiveError, match="times do not grow with size|beyond any link"):
        fit_nccl_tests(flat)
    nearly_flat = table.__class__(tuple(r.__class__(r.size_bytes, 580.2 + i * 1e-3, r.algbw_gbps,
                                                    r.busbw_gbps) for i, r in enumerate(table.rows)),
                                  table.n_ranks, table.factor)
    with pytest.raises(CollectiveError, match="beyond any link"):
        fit_nccl_tests(nearly_flat)


def garble(text: str, data) -> str:
    lines = text.splitlines()
    i = data.draw(st.integers(0, len(lines) - 1), label="line")
    line = lines[i]
    how = data.draw(st.sampled_from(["replace", "delete", "insert", "drop", "split", "join", "swap",
                                     "duplicate"]), label="how")
    tokens = line.split()
    j = data.draw(st.integers(0, max(len(line) - 1, 0)), label="at")
    k = data.draw(st.integers(0, max(len(tokens) - 1, 0)), label="token")
    char = data.draw(st.sampled_from(list("0123456789.,-x eE#\t")), label="char")
    if how == "replace" and line:
        line = line[:j] + char + line[j + 1:]
    elif how == "delete" and line:
        line = line[:j] + line[j + 1:]
    elif how == "insert":
        line = line[:j] + char + line[j:]
    elif tokens and how == "drop":
        line = " ".join(tokens[:k] + tokens[k + 1:])
    elif tokens and how == "split":
        t = tokens[k]
        line = " ".join(tokens[:k] + [t[: len(t) // 2], t[len(t) // 2:]] + tokens[k + 1:])
    elif len(tokens) > k + 1 and how == "join":
        line = " ".join(tokens[:k] + [tokens[k] + tokens[k + 1]] + tokens[k + 2:])
    elif len(tokens) > k + 1 and how == "swap":
        tokens[k], tokens[k + 1] = tokens[k + 1], tokens[k]
        line = " ".join(tokens)
    elif how == "duplicate":
        lines.insert(i, line)
    lines[i] = line
    return "\n".join(lines)


@FUZZ
@given(data=st.data(), table=st.sampled_from(["seed002_pcie_pair.txt", "seed002_host_bridge.txt", "native"]))
def test_a_garbled_line_of_a_real_table_is_refused_in_one_sentence_or_fits_within_physics(data, table):
    text = NATIVE if table == "native" else (DATA / table).read_text()
    text = garble(text, data)
    try:
        fit = fit_nccl_tests(parse_nccl_tests(text))
    except CollectiveError as exc:
        assert one_sentence(str(exc))
        return
    assert math.isfinite(fit.latency_s) and fit.latency_s >= 0
    assert 0 < fit.busbw <= MAX_BUSBW
