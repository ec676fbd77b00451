import importlib.util

from dpfl.bench.cs import run_bench


def test_bench_runs_on_a_small_setting_and_reports_measured_numbers():
    r = run_bench(n=20_000, ratio=0.05, chunks=4, owlqn_chunks=2, ref_chunks=1, ref_tol=1e-3, clients=0,
                  print_table=False)
    assert r["setting"]["m"] == 1000 and r["setting"]["P"] == 4
    solvers = r["signals"]["sparse, U = m/10"]["solvers"]
    ours = solvers["ADMM tol=0.01"]
    assert ours["seconds"] > 0 and ours["iterations"] >= 1
    assert 0 <= ours["objective_gap"] < 0.05 and ours["rel_error"] < 1.0
    assert ours["rel_dist_to_minimizer"] < 1.0
    if importlib.util.find_spec("lbfgs") is not None:  # pylbfgs is optional (benchmark only)
        owl = solvers["OWL-QN (pylbfgs)"]
        assert owl["objective_gap"] >= 0 and "speedup_vs_owlqn" in ours
