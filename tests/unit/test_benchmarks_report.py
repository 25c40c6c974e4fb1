"""The benchmark report's medians over rounds: what a figure in BENCHMARKS.md is."""

from __future__ import annotations

from benchmarks.report import medians, targets


def run(refused: int | None, sent: int, p99: float) -> dict:
    errors = {} if refused is None else {"503": refused}
    return {"tiny": {"open": {"0.9": {"sent": sent, "errors": errors, "p99_ms": p99}}}}


def test_a_round_without_refusals_counts_as_none_refused_in_the_median() -> None:
    rounds = [{"mservd": run(150, 24_000, 50.0)}, {"mservd": run(None, 22_000, 20.0)},
              {"mservd": run(340, 20_000, 40.0)}]
    merged = medians(rounds)["mservd"]["tiny"]["open"]["0.9"]
    assert merged["errors"] == {"503": 150}  # the median of 150, 0 and 340, not of 150 and 340
    assert merged["sent"] == 22_000 and merged["p99_ms"] == 40.0


def test_an_error_kind_most_rounds_did_not_have_is_left_out() -> None:
    rounds = [{"mservd": run(None, 100, 1.0)}, {"mservd": run(None, 100, 1.0)},
              {"mservd": run(5, 100, 1.0)}]
    assert medians(rounds)["mservd"]["tiny"]["open"]["0.9"]["errors"] == {}


def resnet_c1(throughput: float, valid: bool = True) -> dict:
    return {"resnet18": {"closed": {"1": {"throughput": throughput}}},
            "machine": {"valid": valid}}


def test_a_target_met_on_the_medians_shows_the_rounds_that_missed_it() -> None:
    rounds = [{"mservd": resnet_c1(30.0), "naive-flask": resnet_c1(29.0)},
              {"mservd": resnet_c1(28.0), "naive-flask": resnet_c1(29.5)},
              {"mservd": resnet_c1(31.0), "naive-flask": resnet_c1(30.0)},
              {"mservd": resnet_c1(10.0, valid=False), "naive-flask": resnet_c1(30.0)}]
    results = {"rounds": rounds, "systems": medians(rounds)}
    row = next(line for line in targets(results).splitlines() if "resnet18 c=1" in line)
    assert "| met |" in row  # 30.0 against 29.5 on the medians of the valid rounds
    assert row.endswith("| 2 of 3: 1.03x; 0.95x; 1.03x |")  # the invalid round not judged


def test_a_round_under_the_in_process_limit_says_so_beside_its_ratio() -> None:
    def c64(throughput: float) -> dict:
        return {"resnet18": {"closed": {"64": {"throughput": throughput}}}}

    rounds = [{"mservd": c64(38.0), "naive-flask": c64(27.0)},
              {"mservd": c64(36.0), "naive-flask": c64(27.0)}]
    results = {"rounds": rounds, "systems": medians(rounds),
               "inprocess": {"resnet18": {"throughput": 40.0}}}
    row = next(line for line in targets(results).splitlines() if "resnet18 c=64" in line)
    assert row.endswith("| 1 of 2: 1.41x (95% of the limit); 1.33x (90% of the limit) |")


def test_each_round_is_judged_against_the_limit_measured_beside_it() -> None:
    """The machine's speed moves from minute to minute: a round's c=64 is judged against the
    limit measured just before it, not the one measured once at the start of the run."""
    def c64(throughput: float, limit: float | None = None) -> dict:
        entry: dict = {"closed": {"64": {"throughput": throughput}}}
        if limit is not None:
            entry["inprocess_limit"] = {"throughput": limit}
        return {"resnet18": entry}

    rounds = [{"mservd": c64(38.0, 39.0), "naive-flask": c64(27.0)},
              {"mservd": c64(33.0, 34.0), "naive-flask": c64(27.0)}]
    results = {"rounds": rounds, "systems": medians(rounds),
               "inprocess": {"resnet18": {"throughput": 40.0}}}  # a quick minute at the start
    row = next(line for line in targets(results).splitlines() if "resnet18 c=64" in line)
    assert "| met |" in row and "97% of the in-process limit 36.5" in row  # 35.5 / 36.5
    assert row.endswith("| 2 of 2: 1.41x (97% of the limit); 1.22x (97% of the limit) |")
