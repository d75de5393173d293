import math

import numpy as np
import pytest
from scipy import stats

from spatial_jax.eval import grounding as g


def test_estimate_mean_sem_and_nan_dropped():
    e = g.estimate([1.0, 2.0, 3.0, float("nan"), None])
    assert e.n == 3 and e.mean == pytest.approx(2.0)
    assert e.sem == pytest.approx(1.0 / math.sqrt(3))
    assert g.estimate([]).n == 0 and math.isnan(g.estimate([]).mean)
    assert g.estimate([5.0]).sem == 0.0


def test_accuracy_by_category_is_sample_weighted():
    acc = g.accuracy_by_category([1, 0, 1, 1], ["a", "a", "b", "b"])
    assert acc["a"].mean == 0.5 and acc["b"].mean == 1.0
    assert acc["overall"].mean == pytest.approx(0.75) and acc["overall"].n == 4
    with pytest.raises(ValueError):
        g.accuracy_by_category([1], ["a", "b"])


def test_weighted_accuracy_uses_official_sizes():
    per = {k: 1.0 if k == "Allocentric" else 0.0 for k in g.OMNISPATIAL_SIZES}
    assert sum(g.OMNISPATIAL_SIZES.values()) == 1533 and sum(g.SPATIALAB_SIZES.values()) == 1400
    assert g.weighted_accuracy(per, g.OMNISPATIAL_SIZES) == pytest.approx(376 / 1533)
    with pytest.raises(ValueError, match="without a score"):
        g.weighted_accuracy({}, g.SPATIALAB_SIZES)


def test_quartiles_and_spearman():
    rng = np.random.default_rng(0)
    h = rng.uniform(size=200)
    iou = 1.0 - h + 0.05 * rng.normal(size=200)
    q = g.iou_by_uncertainty_quartile(h, iou)
    assert [e.n for e in q] == [50, 50, 50, 50]
    assert q[0].mean > q[1].mean > q[2].mean > q[3].mean
    rho = g.uncertainty_iou_spearman(h, iou)
    assert rho == pytest.approx(stats.spearmanr(h, iou).statistic) and rho < -0.9
    assert math.isnan(g.uncertainty_iou_spearman([0.1, 0.2], [0.3, 0.4]))
    assert math.isnan(g.uncertainty_iou_spearman([0.1, 0.1, 0.1], [0.3, 0.4, 0.5]))
