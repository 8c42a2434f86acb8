"""NUMA plans from fake sysfs trees (tests/data/numa/, written by make_trees.py next to them):
topology parsing, the CPUs each pool pins, groups per node, row splits, warnings and refusals.
Expected pins are written out by hand from each machine's numbering (see make_trees.py)."""
import importlib.util
from pathlib import Path

import pytest

from gemma4cpu import numa
from gemma4cpu.numa import NumaError, plan, read_topology, split_rows

DATA = Path(__file__).parent / "data" / "numa"


def _load_maker():
    spec = importlib.util.spec_from_file_location("make_trees", DATA / "make_trees.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


make_trees = _load_maker()


@pytest.fixture(scope="module")
def epyc():
    return read_topology(str(DATA / "epyc9655_2s_nps4"))


@pytest.fixture(scope="module")
def xeon():
    return read_topology(str(DATA / "xeon8480_2s_smt"))


@pytest.fixture(scope="module")
def laptop():
    return read_topology(str(DATA / "laptop_1node"))


@pytest.fixture(scope="module")
def container():
    return read_topology(str(DATA / "container_cgroup"))


def test_trees_are_what_the_generator_writes(tmp_path):
    """The checked-in trees are exactly make_trees.py's output (regenerate them after editing it)."""
    for name, spec in make_trees.specs().items():
        make_trees.write_tree(tmp_path / name, spec)
        want = {p.relative_to(tmp_path / name): p.read_text() for p in (tmp_path / name).rglob("*") if p.is_file()}
        have = {p.relative_to(DATA / name): p.read_text() for p in (DATA / name).rglob("*") if p.is_file()}
        assert have == want, name


def test_epyc_topology(epyc):
    t = epyc
    assert sorted(t.nodes) == list(range(8)) and len(t.cpus) == 384
    assert t.packages == [0, 1] and len(t.cores()) == 192
    assert t.nodes[5].cpus == tuple(range(120, 144)) + tuple(range(312, 336))
    assert t.cpus[200].siblings == (8, 200) and t.cpus[200].core == 8
    assert t.cpus[200].l3 == 8 and len(t.l3_groups(t.nodes[0].cpus)) == 3     # 3 CCDs per NPS4 node
    assert t.distance(0, 0) == 10 and t.distance(0, 3) == 12 and t.distance(1, 6) == 32
    assert t.nodes[3].mem_total == 192 << 30 and t.nodes[3].mem_available == 184 << 30
    assert t.numa_balancing == 1 and t.thp == "always" and t.model.startswith("AMD EPYC 9655")
    assert t.allowed_cpus == tuple(range(384)) and t.allowed_mems == tuple(range(8))
    text = "\n".join(t.describe())
    assert "8 NUMA node(s), 192 cores, 384 CPUs" in text and "node 7: CPUs 168-191,360-383" in text


def test_epyc_default_is_distribute_over_every_core(epyc):
    p = plan(epyc)
    assert p.mode == "distribute" and p.nodes == tuple(range(8)) and p.mem_nodes == tuple(range(8))
    assert p.decode.cpus == tuple(range(192))          # physical cores only, node by node
    assert p.decode.group_first == tuple(range(0, 193, 24)) and p.batch is p.decode
    assert p.row_split(262144) == tuple(range(0, 262145, 32768))
    assert any("NUMA balancing is on" in w for w in p.warnings)


def test_epyc_few_threads_spread_over_nodes_and_ccds(epyc):
    p = plan(epyc, "distribute", threads=16)
    # two per node, on different CCDs (L3 groups of 8 cores)
    assert p.decode.cpus == (0, 8, 24, 32, 48, 56, 72, 80, 96, 104, 120, 128, 144, 152, 168, 176)
    assert p.decode.group_first == tuple(range(0, 17, 2))
    p = plan(epyc, "distribute", threads=12)            # 12 = 8 + 4: nodes 0-3 get a second thread
    assert p.decode.cpus == (0, 8, 24, 32, 48, 56, 72, 80, 96, 120, 144, 168)
    assert p.decode.workers_per_group == (2, 2, 2, 2, 1, 1, 1, 1)
    assert p.row_split(5376) == (0, 896, 1792, 2688, 3584, 4032, 4480, 4928, 5376)
    p = plan(epyc, "isolate", threads=6)
    assert p.nodes == (0,) and p.decode.cpus == (0, 1, 8, 9, 16, 17) and p.row_split(100) is None


def test_epyc_auto_with_fewer_threads_than_nodes(epyc):
    p = plan(epyc, threads=4)                           # auto: the first 4 nodes, one thread each
    assert p.mode == "distribute" and p.decode.cpus == (0, 24, 48, 72) and p.nodes == (0, 1, 2, 3)
    p = plan(epyc, threads=1)
    assert p.mode == "isolate" and p.decode.cpus == (0,) and p.mem_nodes == (0,)
    p = plan(epyc, threads=8, threads_batch=2)          # the smaller pool decides the nodes
    assert p.nodes == (0, 1) and p.decode.group_first == (0, 4, 8) and p.batch.group_first == (0, 1, 2)


def test_epyc_smt_only_when_asked_or_needed(epyc):
    p = plan(epyc, smt=True)
    assert p.decode.threads == 384 and set(p.decode.cpus) == set(range(384))
    assert p.decode.per_node()[0] == list(range(24)) + list(range(192, 216))
    assert any("384 on 192 physical core(s)" in w for w in p.warnings)
    p = plan(epyc, threads=200)                         # 8 past the cores: one sibling per node
    assert p.decode.per_node()[0] == list(range(24)) + [192]
    assert p.decode.per_node()[7] == list(range(168, 192)) + [360]
    assert any("threads=200 on 192 physical core(s)" in w for w in p.warnings)


def test_epyc_cpu_list_and_batch_pool(epyc):
    p = plan(epyc, "distribute", cpus=list(range(0, 12)) + list(range(24, 36)))   # --cpus 0-11,24-35
    assert p.nodes == (0, 1) and p.decode.cpus == tuple(range(12)) + tuple(range(24, 36))
    assert p.decode.group_first == (0, 12, 24)
    assert all("NUMA balancing" in w for w in p.warnings)    # an explicit list is not a narrow mask
    p = plan(epyc, "distribute", threads=96, threads_batch=192)
    assert p.decode.threads == 96 and p.batch.threads == 192 and p.batch is not p.decode
    assert p.decode.group_nodes == p.batch.group_nodes == tuple(range(8))
    assert p.decode.per_node()[1] == [24, 25, 26, 27, 32, 33, 34, 35, 40, 41, 42, 43]  # 12 over 3 CCDs
    p = plan(epyc, "isolate", nodes=[5])
    assert p.decode.cpus == tuple(range(120, 144)) and p.mem_nodes == (5,)


def test_epyc_interleave_and_none(epyc):
    p = plan(epyc, "interleave")
    assert p.decode.cpus == tuple(range(192)) and p.decode.group_first == (0, 192)
    assert p.mem_nodes == tuple(range(8)) and p.row_split(1000) is None
    p = plan(epyc, "none", threads=30)                  # no NUMA logic: the first 30 cores in order
    assert p.decode.cpus == tuple(range(30)) and p.mem_nodes == () and p.row_split(1000) is None


def test_xeon(xeon):
    assert len(xeon.cores()) == 112 and len(xeon.l3_groups()) == 2
    p = plan(xeon)
    assert p.mode == "distribute" and p.decode.group_first == (0, 56, 112)
    assert p.decode.cpus == tuple(range(112)) and not p.warnings
    assert plan(xeon, threads=8).decode.cpus == (0, 1, 2, 3, 56, 57, 58, 59)
    assert plan(xeon, smt=True).decode.per_node()[1] == list(range(56, 112)) + list(range(168, 224))
    assert plan(xeon, "isolate", threads=8, nodes=[1]).decode.cpus == tuple(range(56, 64))
    assert plan(xeon, "none", threads=60).decode.cpus == tuple(range(60))
    assert plan(xeon, "mirror").row_split(2560) == (0, 1280, 2560)


def test_laptop(laptop):
    p = plan(laptop)
    assert p.mode == "none" and p.decode.cpus == (0, 2, 4, 6, 8, 10, 12, 14) and not p.warnings
    p = plan(laptop, threads=10)
    assert p.decode.cpus == (0, 1, 2, 3, 4, 6, 8, 10, 12, 14)
    assert any("threads=10 on 8 physical core(s)" in w for w in p.warnings)
    for mode in ("distribute", "mirror", "isolate", "interleave"):
        p = plan(laptop, mode)
        assert p.nodes == (0,) and p.mem_nodes == (0,) and p.row_split(4096) is None
        assert p.decode.group_first == (0, 8)
    assert plan(laptop, smt=True).decode.cpus == tuple(range(16))


def test_container_cgroup(container):
    c = container
    assert c.allowed_cpus == tuple(range(8, 24)) + tuple(range(40, 56)) and c.cpu_quota == 8.0
    assert c.thp == "never"
    p = plan(c)                                          # 8 threads (the quota), 4 per node
    assert p.mode == "distribute" and p.decode.cpus == (8, 9, 10, 11, 16, 17, 18, 19)
    assert p.decode.group_first == (0, 4, 8)
    assert any("quota 8 CPUs" in n for n in p.notes)
    assert any("allows 32 of the 64 online CPUs" in w for w in p.warnings)
    p = plan(c, threads=16)
    assert p.decode.cpus == tuple(range(8, 24))
    assert any("cgroup CPU quota is 8 CPUs" in w for w in p.warnings)
    assert plan(c, "isolate").decode.cpus == tuple(range(8, 16))
    with pytest.raises(NumaError, match=r"CPU\(s\) 0-3 are not among the CPUs this process may use \(8-23,40-55"):
        plan(c, cpus=[0, 1, 2, 3])
    with pytest.raises(NumaError, match="threads=40: more threads than CPUs: this process may use 32"):
        plan(c, threads=40)


def test_memory_nodes_limit_the_plan(tmp_path):
    spec = make_trees.specs()["container_cgroup"]
    spec = dict(spec, allowed_mems=[0], cgroup=dict(spec["cgroup"], mems=[0]))
    make_trees.write_tree(tmp_path / "t", spec)
    t = read_topology(str(tmp_path / "t"))
    assert t.allowed_mems == (0,)
    p = plan(t, "distribute", threads=8)
    assert p.nodes == (0,) and p.decode.cpus == tuple(range(8, 16))
    assert any("node(s) 1 are not allowed memory nodes" in w for w in p.warnings)
    with pytest.raises(NumaError, match="not in this process's allowed memory nodes 0"):
        plan(t, "isolate", nodes=[1])


def test_narrow_mask_warns(epyc):
    t = read_topology(epyc.root, allowed_cpus=range(48))
    p = plan(t, "distribute")
    assert p.nodes == (0, 1) and p.decode.threads == 48
    assert any("allows 48 of the 384 online CPUs" in w for w in p.warnings)
    assert any("reaches node(s) 0-1 of 0-7" in w for w in p.warnings)


@pytest.mark.parametrize("kw,match", [
    (dict(cpus=[0, 400]), r"CPU\(s\) 400 are not among"),
    (dict(nodes=[9]), r"unknown NUMA node\(s\) 9; this machine has node\(s\) 0-7"),
    (dict(threads=385), "threads=385: more threads than CPUs"),
    (dict(threads=0), "threads must be an integer >= 1"),
    (dict(threads=4, cpus=[0, 1]), "give one CPU per thread"),
    (dict(cpus=[0, 0]), "names a CPU twice"),
    (dict(mode="distribute", threads=4), "needs at least one thread per node"),
    (dict(mode="isolate", cpus=[0, 30]), "runs on one node"),
    (dict(mode="spread"), "unknown NUMA mode 'spread'"),
    (dict(threads=192, threads_batch=400), "threads_batch=400: more threads than CPUs"),
])
def test_bad_requests(epyc, kw, match):
    with pytest.raises(NumaError, match=match):
        plan(epyc, **kw)


def test_split_rows_properties():
    for n in (1, 15, 16, 17, 640, 1000, 2560, 262144):
        for w in ([1], [1, 1], [2, 1, 1], [3, 3, 3, 3, 3, 3, 3, 1], [24] * 8):
            b = split_rows(n, w)
            assert b[0] == 0 and b[-1] == n and len(b) == len(w) + 1
            assert all(b[i] <= b[i + 1] for i in range(len(w)))
            assert all(x % numa.ROW_ALIGN == 0 or x == n for x in b[1:-1])
    assert split_rows(1000, [2, 1, 1]) == (0, 496, 752, 1000)


def test_recommend(epyc, laptop):
    r = numa.recommend(epyc, model_bytes=20 << 30)
    assert r[0].startswith("python -m gemma4cpu.run -m MODEL.gguf --numa distribute -t 192")
    assert "(fits)" in r[1] and any("numa_balancing" in x for x in r)
    assert "(does NOT fit" in numa.recommend(epyc, model_bytes=300 << 30)[1]
    assert numa.recommend(laptop)[0].endswith("physical cores 0,2,4,6,8,10,12,14")


def test_live_topology_is_this_machine():
    import os
    t = read_topology("/")
    assert t.live and set(t.allowed_cpus) == set(os.sched_getaffinity(0))
    assert set(t.allowed_cpus) <= set(t.cpus) and t.allowed_mems
    p = plan(t)
    assert set(p.decode.cpus) <= set(t.allowed_cpus)


def test_format_cpu_list():
    assert numa.format_cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and numa.format_cpu_list([]) == "(none)"
