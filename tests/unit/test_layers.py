"""The layer order of docs/architecture.md holds: imports point down, roles never import each other, no circles."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _check_layers():
    from scripts import check_layers

    return check_layers


def test_every_import_points_down_the_layers_and_none_runs_in_a_circle():
    check = _check_layers()
    graph = check.import_graph()
    assert len(graph) > 100  # the project's modules were found
    assert check.layer_violations(graph) == []
    assert check.circles(graph) == []
    libraries = {name: check.libraries_of(path) for name, path in check.project_modules().items()}
    assert check.redis_violations(libraries) == []


def test_the_check_catches_an_upward_import_a_sideways_one_and_a_circle():
    check = _check_layers()
    graph = {
        "buffer.records": {"learner.trainer"},  # up
        "learner.trainer": {"generators.agent"},  # sideways, between the two roles
        "generators.agent": {"buffer.records"},
        "tasks.base": {"config.loader"},  # the config, from below: only sr1/ and world/ load it
        "retrieval.dense": {"retrieval.corpus"},
        "retrieval.corpus": {"retrieval.dense"},  # a circle inside one package
    }
    problems = check.layer_violations(graph)
    assert any(p.startswith("buffer.records imports learner.trainer") for p in problems)
    assert any(p.startswith("learner.trainer imports generators.agent") for p in problems)
    assert any(p.startswith("tasks.base imports config.loader") for p in problems)
    assert not any(p.startswith("generators.agent") for p in problems)
    assert sorted(map(tuple, check.circles(graph))) == [
        ("buffer.records", "generators.agent", "learner.trainer"),
        ("retrieval.corpus", "retrieval.dense"),
    ]


def test_every_package_of_the_project_has_a_layer():
    check = _check_layers()
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - {"tests"} <= set(check.LAYER_OF), packages - set(check.LAYER_OF)


def test_the_check_catches_redis_imported_outside_the_buffer(tmp_path):
    check = _check_layers()
    role = tmp_path / "follower.py"
    role.write_text("import asyncio\n\nimport redis.exceptions\n\nfrom buffer.connection import RETRIED\n")
    libraries = {
        "generators.follower": check.libraries_of(role),  # a role catching redis's errors itself
        "buffer.connection": {"redis", "socket"},
        "weight_sync.rendezvous": {"buffer", "json"},  # Redis through buffer.connection: allowed
    }
    problems = check.redis_violations(libraries)
    assert len(problems) == 1 and problems[0].startswith("generators.follower imports redis")


def test_the_check_reads_the_scripts_the_shared_fakes_and_the_tests():
    graph = _check_layers().import_graph()
    assert {
        "scripts.chaos.base",
        "scripts.bench.bench_buffer",
        "fakes.groups",
        "tests.unit.test_layers",
    } <= set(graph)
    assert "scripts.chaos.base" in graph["scripts.chaos.chaos_faults"]


def test_the_check_catches_an_import_up_into_scripts_or_tests_and_a_circle_among_scripts():
    check = _check_layers()
    graph = {
        "sr1.cli": {"scripts.bench.bench_buffer"},  # the product, up into the scripts
        "fakes.groups": {
            "scripts.chaos.base"
        },  # the fakes the scripts share with the tests, up into the scripts
        "scripts.bench.bench_buffer": {
            "tests.fakes.engine",
            "buffer.records",
            "fakes.groups",
        },  # into the tests
        "tests.unit.test_x": {"scripts.chaos.chaos", "fakes.groups", "sr1.cli"},  # the tests import anything
        "scripts.chaos.base": {"scripts.chaos.chaos_faults"},
        "scripts.chaos.chaos_faults": {"scripts.chaos.base"},  # a circle inside scripts/
    }
    problems = check.layer_violations(graph)
    assert [p.split(":")[0] for p in problems] == [
        "fakes.groups imports scripts.chaos.base",
        "scripts.bench.bench_buffer imports tests.fakes.engine",
        "sr1.cli imports scripts.bench.bench_buffer",
    ]
    assert "nothing imports the tests" in problems[1]
    assert check.circles(graph) == [["scripts.chaos.base", "scripts.chaos.chaos_faults"]]
