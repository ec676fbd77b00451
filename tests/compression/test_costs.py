import pytest

from dpfl.compression.costs import average_cost, message_bits, thesis_costs
from dpfl.errors import ConfigError

FM = 1_663_370  # Fashion-MNIST CNN
MED = 1_496_601  # medical MLP


def test_tier1_cost_anchors():
    """Reference §9.4 Tier-1 anchors, to the printed precision."""
    assert round(thesis_costs("fl-std", FM, 191, 1 / 60, "Mbit")[1], 2) == 169.44
    assert round(thesis_costs("fl-cs", FM, 200, 1 / 60, "Mbit", r=0.05)[1], 2) == 8.87
    assert round(thesis_costs("signsgd", FM, 200, 1.0, "Mbit")[1], 2) == 332.67
    assert round(thesis_costs("fl-std", MED, 99, 100 / 5011, "Mbit")[1], 2) == 94.62
    down, up = thesis_costs("fl-top", FM, 200, 1 / 60, "KB", r=0.005)
    assert round(down, 2) == round(up, 2) == 110.88  # K = 8316, not r·n = 8316.85
    assert round(thesis_costs("fl-std", FM, 200, 1 / 60, "KB")[0], 2) == 22178.27
    assert round(thesis_costs("fl-top", MED, 68, 100 / 5010, "KB", r=0.001)[1], 2) == 8.12
    down, up = thesis_costs("fl-sign-dp", MED, 97, 100 / 5010, "KB", up_bits=22)
    assert (round(down, 2), round(up, 2)) == (11590.44, 7968.43)
    assert round(thesis_costs("fl-std", 1_369_738, 375, 0.1, "MB")[1], 2) == 205.46
    assert round(thesis_costs("fl-sign", 1_369_738, 386, 0.1, "MB")[1], 2) == 6.61


@pytest.mark.parametrize("scheme,r,rnd,cost", [
    ("fl-rnd", 0.05, 192, 8.52), ("fl-freq", 0.05, 189, 8.38), ("fl-cs", 0.05, 200, 8.87),
    ("fl-rnd", 0.1, 200, 17.74), ("fl-freq", 0.1, 197, 17.48), ("fl-cs", 0.1, 199, 17.65),
    ("fl-rnd", 0.2, 200, 35.49), ("fl-freq", 0.2, 195, 34.60), ("fl-cs", 0.2, 193, 34.24),
    ("fl-std", 1.0, 191, 169.44),
])
def test_table_4_2_costs(scheme, r, rnd, cost):
    assert round(thesis_costs(scheme, FM, rnd, 1 / 60, "Mbit", r=r)[1], 2) == cost


@pytest.mark.parametrize("scheme,r,rnd,down,up", [
    ("fl-basic", 0.005, 193, 21402.03, 107.00), ("fl-cs", 0.005, 185, 20514.90, 102.56),
    ("fl-top", 0.005, 200, 110.88, 110.88), ("fl-basic", 0.05, 196, 21734.70, 1086.73),
    ("fl-cs", 0.05, 200, 22178.27, 1108.91), ("fl-top", 0.05, 200, 1108.91, 1108.91),
    ("fl-basic", 0.1, 196, 21734.70, 2173.47), ("fl-cs", 0.1, 182, 20182.22, 2018.22),
    ("fl-top", 0.1, 199, 2206.74, 2206.74), ("fl-std", 1.0, 200, 22178.27, 22178.27),
    ("fl-sign", 1.0, 197, 21845.59, 682.67),
])
def test_table_4_4_costs(scheme, r, rnd, down, up):
    d, u = thesis_costs(scheme, FM, rnd, 1 / 60, "KB", r=r)
    assert (round(d, 2), round(u, 2)) == (down, up)


def test_table_4_1_fashion_mnist_row():
    assert round(thesis_costs("fl-std", FM, 90, 0.1, "MB")[1], 2) == 59.88
    assert round(thesis_costs("fl-sign", FM, 68, 0.1, "MB")[1], 2) == 1.41


def test_message_bits_and_errors():
    assert message_bits("fl-sign", 10) == (320, 10)
    assert message_bits("FL-TOP", 1000, 0.01) == (320, 320)
    with pytest.raises(ConfigError, match="allowed"):
        message_bits("fl-zip", 10)
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        message_bits("fl-cs", 10, 1.5)
    with pytest.raises(ConfigError, match="unit"):
        average_cost(1, 1, 0.5, "GB")
