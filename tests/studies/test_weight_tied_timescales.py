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
    # (mixed). With the attention (read from the attention state) on a key of zero weight
    # only, the whole attention component is off the support (share 1); on the other, 0.
    J = np.array([[0.6, 0.2], [0.2, 0.6]])
    ts = loop_timescales(J, 1, np.eye(2), step=H, k=1, rho_star=np.array([0.0, 1.0]))
    assert ts.labels == ("mixed",)
    assert ts.stream_distance[0] == pytest.approx(abs(np.log(0.8 / 0.6) / np.log(0.8)))
    R = np.array([[0.0, 0.0], [0.0, 1.0]])
    assert loop_timescales(J, 1, R, step=H, k=1, rho_star=np.array([1.0, 0.0])
                           ).off_support[0] == pytest.approx(1.0)
    assert loop_timescales(J, 1, R, step=H, k=1, rho_star=np.array([0.0, 1.0])
                           ).off_support[0] == pytest.approx(0.0)


def test_the_attention_side_is_the_read_rows_own_modes():
    # J_cc of two attention rows that do not interact (held scores): row A with eigenvalues
    # 0.7 and 0.2, row B with 0.96, and the readout on row A only. Row B's modes carry none
    # of the read attention, so the attention side's slowest decay is log(0.7)/h (not row
    # B's log(0.96)/h) and every read mode is row A's, exactly (block triangular: 1e-10).
    rng = np.random.default_rng(2)
    J = np.zeros((5, 5))
    J[:2, :2] = _rotate([0.9, 0.5], rng)
    J[2:4, 2:4] = _rotate([0.7, 0.2], rng)
    J[4, 4] = 0.96
    J[:2, 2:] = rng.normal(size=(2, 3))
    R = np.zeros((2, 5))
    R[:, 2:4] = np.eye(2)
    ts = loop_timescales(J, 2, R, step=H, k=4)
    assert ts.slowest_attention == pytest.approx(np.log(0.7) / H, rel=1e-12)
    np.testing.assert_allclose(ts.rates.real, np.log([0.7, 0.2]) / H, rtol=1e-10)
    assert ts.labels == ("attention", "attention")
    with pytest.raises(ValueError, match="reads none of the attention state"):
        loop_timescales(J, 2, np.eye(5)[:2], step=H)


def _fisher_block_map(coupling, rng, attention=None):
    """A loop map on (stream, a, da/dt): the stream [0.95, 0.6, 0.3], the attention state's
    block the exact held-score Fisher map of Tsallis(1.5) at five keys (m 0.1, gamma 1,
    T 1, h 0.25; `held_score_map`, checked against simulate's step derivatives in
    test_weight_tied_calibration) or `attention`, and both couplings of size `coupling`."""
    import fisherdyn as fd
    from weight_tied.evidence_held_response import held_score_map, support_basis

    rho = np.array([0.35, 0.25, 0.2, 0.12, 0.08])
    Q = support_basis(rho)
    Jc = (held_score_map(fd.Tsallis(1.5), rho, 1.0, mass=0.1, damping=1.0, step=H)
          if attention is None else attention)
    n, c = 3, Jc.shape[0]
    J = np.zeros((n + c, n + c))
    J[:n, :n] = _rotate([0.95, 0.6, 0.3], rng)
    J[n:, n:] = Jc
    J[:n, n:] = coupling * rng.normal(size=(n, c))
    J[n:, :n] = coupling * rng.normal(size=(c, n))
    R = np.zeros((5, n + c))
    R[:, n:n + Q.shape[1]] = Q  # the attention moves by Q a
    return J, R, rho, fd.Tsallis(1.5)


def test_attention_block_response_reads_the_fisher_map_with_the_stream_held():
    # Reference: the attention state's block is the exact Fisher loop map (held_score_map,
    # an expm of the linearized dynamics written independently of linear_response's
    # relaxation_spectrum). With the stream held linear response says YES on it whatever
    # the coupling, and fits back m = 0.1, gamma = 1 (1.5e-7 measured; tolerance 1e-6: an
    # expm and an eigensolver in float64). On the whole map with couplings of size 0.1
    # (spectral radius 0.90) the stream's slow mode carries attention, the rates move and
    # the same criterion says NO (> 0.3; 1.41 measured): the disagreement is the
    # coupling's. A block that is not a Fisher map (the same eigenvectors, rates spread
    # linearly instead of by the Tsallis stiffnesses) is NO with the stream held too.
    from weight_tied.evidence_response import linear_response
    from weight_tied.evidence_timescales import attention_block_response

    rng = np.random.default_rng(3)
    for coupling in (0.0, 0.1):
        J, R, rho, e = _fisher_block_map(coupling, rng)
        held = attention_block_response(J, 3, R, rho, e, 1.0, step=H)
        assert held.not_evaluable is None and held.max_error < 1e-6
        np.testing.assert_allclose([held.mass, held.damping], [0.1, 1.0], rtol=1e-6)
    whole = linear_response(J, rho, e, 1.0, step=H, readout=R)
    assert whole.max_error > 0.3
    J0, R, rho, e = _fisher_block_map(0.0, rng)
    lam, V = np.linalg.eig(J0[3:, 3:])
    s = np.log(lam.astype(complex)) / H
    order = np.argsort(-s.real)
    spread = s.copy()
    spread[order] = s[order[0]] * np.linspace(1, 4, len(s)) + 1j * s[order].imag
    fake = np.real(V @ np.diag(np.exp(spread * H)) @ np.linalg.inv(V))
    J, R, rho, e = _fisher_block_map(0.0, rng, attention=fake)
    assert attention_block_response(J, 3, R, rho, e, 1.0, step=H).max_error > 0.3


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
    # --resume: with the weights gone, the earlier result is reused where the settings
    # match and not where they differ (the seed then has no model)
    monkeypatch.setenv("FISHERDYN_CACHE", str(tmp_path / "empty"))
    again = main(tiny + ["--seeds", "0", "--modes", "3", "--resume", str(tmp_path / "t.json")])
    assert again["models"]["shannon"] == json.loads((tmp_path / "t.json").read_text())[
        "models"]["shannon"]
    other = main(tiny + ["--seeds", "0", "--modes", "2", "--resume", str(tmp_path / "t.json")])
    assert other["models"]["shannon"] == [] and "0" in other["without_a_model"]["shannon"]
    with pytest.raises(SystemExit, match="no carried attention state"):
        main(tiny[:-6])
