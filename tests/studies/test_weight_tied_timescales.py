"""`loop_timescales` against loop maps whose spectra are known in closed form, and a smoke
run of `python studies/weight_tied timescales` on a tiny cached Fisher loop."""

import json

import numpy as np
import pytest

from weight_tied.evidence_timescales import loop_timescales

H = 0.5  # the loop's step h


def _rotate(d, rng):
    """A matrix with the eigenvalues `d` (real) in a random orthonormal basis."""
    Q = np.linalg.qr(rng.normal(size=(len(d), len(d))))[0]
    return Q @ np.diag(d) @ Q.T


def _blocks(stream, attention, coupling, rng, upper=None):
    n, c = len(stream), len(attention)
    J = np.zeros((n + c, n + c))
    J[:n, :n], J[n:, n:] = _rotate(stream, rng), _rotate(attention, rng)
    J[:n, n:] = coupling * rng.normal(size=(n, c)) if upper is None else upper
    J[n:, :n] = coupling * rng.normal(size=(c, n))
    return J


def test_a_block_triangular_map_has_exactly_each_sides_rates():
    # Reference: with J_cx = 0 the spectrum of J is that of J_xx and J_cc (block
    # triangular), so each slow mode lies on one side's rate to rounding (tolerance 1e-10)
    # and is labelled by it; the slowest decays of each side are log(0.9)/h and log(0.7)/h.
    rng = np.random.default_rng(0)
    stream, attention = [0.9, 0.5, 0.3], [0.7, 0.2]
    J = _blocks(stream, attention, 0.0, rng, upper=rng.normal(size=(3, 2)))
    ts = loop_timescales(J, 3, np.eye(5), step=H, k=4)
    np.testing.assert_allclose(ts.rates.real, np.log([0.9, 0.7, 0.5, 0.3]) / H, rtol=1e-10)
    assert ts.labels == ("stream", "attention", "stream", "stream")
    assert np.all(np.minimum(ts.stream_distance, ts.attention_distance) < 1e-10)
    assert ts.slowest_stream == pytest.approx(np.log(0.9) / H, rel=1e-12)
    assert ts.slowest_attention == pytest.approx(np.log(0.7) / H, rel=1e-12)
    assert np.all(np.isnan(ts.off_support))


def test_weak_coupling_moves_the_rates_at_second_order():
    # Reference: perturbation theory. With both off-diagonal blocks of size eps the
    # eigenvalues move by O(eps^2) (the first-order term of a block-off-diagonal
    # perturbation vanishes), so halving eps divides the distance to the nearer side's rate
    # by 4 (within 10 %: the O(eps^3) rest at eps = 0.02).
    rng = np.random.default_rng(1)
    base = _blocks([0.9, 0.5], [0.6, 0.3], 1.0, rng)
    n = 2

    def distance(eps):
        J = base.copy()
        J[:n, n:] *= eps
        J[n:, :n] *= eps
        ts = loop_timescales(J, n, np.eye(4), step=H, k=4)
        return np.minimum(ts.stream_distance, ts.attention_distance)

    d1, d2 = distance(0.02), distance(0.01)
    np.testing.assert_allclose(d1 / d2, 4.0, rtol=0.1)
    assert np.max(d1) < 0.01


def test_strong_coupling_is_mixed_and_the_support_share_is_read():
    # [[0.6, 0.2], [0.2, 0.6]] has eigenvalues 0.8 and 0.4, both sides alone 0.6: the
    # slow rate log(0.8)/h is |log 0.8 - log 0.6| / |log 0.8| = 1.29 from each, neither side
    # (mixed). With the attention read out on a key of zero weight only, the whole
    # attention component is off the support (share 1); on the other key, 0.
    J = np.array([[0.6, 0.2], [0.2, 0.6]])
    ts = loop_timescales(J, 1, np.eye(2), step=H, k=1, rho_star=np.array([0.0, 1.0]))
    assert ts.labels == ("mixed",)
    assert ts.stream_distance[0] == pytest.approx(abs(np.log(0.8 / 0.6) / np.log(0.8)))
    R = np.array([[1.0, 0.0], [0.0, 0.0]])
    assert loop_timescales(J, 1, R, step=H, k=1, rho_star=np.array([0.0, 1.0])
                           ).off_support[0] == pytest.approx(1.0)
    assert loop_timescales(J, 1, R, step=H, k=1, rho_star=np.array([1.0, 0.0])
                           ).off_support[0] == pytest.approx(0.0)


def test_bad_input_is_refused():
    J = np.eye(3) * 0.5
    with pytest.raises(ValueError, match="no attention timescale"):
        loop_timescales(J, 3, np.eye(3), step=H)
    with pytest.raises(ValueError, match="square jacobian"):
        loop_timescales(J[:2], 1, np.eye(3), step=H)
    with pytest.raises(ValueError, match="finite"):
        loop_timescales(np.full((3, 3), np.nan), 1, np.eye(3), step=H)
    with pytest.raises(ValueError, match="rho_star"):
        loop_timescales(J, 1, np.eye(3), step=H, rho_star=np.ones(2) / 2)


def test_timescales_command_reads_cached_fisher_loops(tmp_path, monkeypatch):
    # Smoke: the pilot trains a tiny Fisher loop (3 steps) into a temporary cache; the
    # command reads it (and lists the untrained seed 1 as without a model), labels every
    # problem's and head's slow modes, and writes its JSON and figure.
    monkeypatch.setenv("FISHERDYN_CACHE", str(tmp_path))
    from weight_tied.pilot import main as pilot
    from weight_tied.timescales import main

    tiny = ["--nodes", "4", "--hops", "2", "--dim", "8", "--width", "8", "--loops", "2",
            "--steps", "3", "--batch", "4", "--problems", "8", "--fp-problems", "2",
            "--jacobians", "1", "--no-progress", "--loop-kind", "fisher", "--mass", "0.5",
            "--substeps", "2"]
    pilot(tiny)
    out = main(tiny + ["--seeds", "0,1", "--modes", "3", "--json", str(tmp_path / "t.json"),
                       "--figure", str(tmp_path / "t.png")])
    (model,) = out["models"]["shannon"]
    assert len(model["heads"]) == 2 and all(len(h["labels"]) <= 3 for h in model["heads"])
    assert "no cached weights for seed 1" in out["without_a_model"]["shannon"]["1"]
    s = out["families"]["shannon"]
    assert sum(s["slowest_mode"].values()) == 2 and len(s["speed_ratio_by_seed"]) == 1
    assert json.loads((tmp_path / "t.json").read_text())["settings"]["modes"] == 3
    assert (tmp_path / "t.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no carried attention state"):
        main(tiny[:-6])
