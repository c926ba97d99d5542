"""The grid module FrozenLake and thin ice share: moves, walking, BFS paths, rendering and reading a map back."""

from __future__ import annotations

import itertools
import random

import pytest

from tether.envs import frozenlake, grid, thin_ice


def random_map(rng: random.Random, rows: int, cols: int, tiles: str = "FFFHT") -> list[str]:
    cells = [[rng.choice(tiles) for _ in range(cols)] for _ in range(rows)]
    cells[0][0], cells[-1][-1] = "S", "G"
    return ["".join(r) for r in cells]


def distances(desc: list[str], avoid: str) -> dict[tuple[int, int], int]:
    """Fewest moves from every cell to the goal, by relaxing until nothing changes (a reference independent of
    BFS order); the goal's own tile is never avoided."""
    n_rows, n_cols = len(desc), len(desc[0])
    dist = {(r, c): 0 for r in range(n_rows) for c in range(n_cols) if desc[r][c] == "G"}
    changed = True
    while changed:
        changed = False
        for r, c in itertools.product(range(n_rows), range(n_cols)):
            for dr, dc in ((0, 1), (0, -1), (1, 0), (-1, 0)):
                nr, nc = r + dr, c + dc
                if (0 <= nr < n_rows and 0 <= nc < n_cols and (nr, nc) in dist and desc[nr][nc] not in avoid
                        and dist[(nr, nc)] + 1 < dist.get((r, c), 10**9)):
                    dist[(r, c)], changed = dist[(nr, nc)] + 1, True
    return dist


@pytest.mark.parametrize("rows, cols", [(5, 5), (3, 7), (6, 4)])
def test_shortest_path_is_as_short_as_the_reference_and_steps_on_no_avoided_tile(rows, cols):
    rng = random.Random(rows * 10 + cols)
    found = 0
    for _ in range(200):
        desc = random_map(rng, rows, cols)
        dist = distances(desc, avoid="HT")
        path = grid.shortest_path(desc, 0, 0, avoid="HT")
        if (0, 0) not in dist:
            assert path is None
            continue
        found += 1
        assert len(path) == dist[(0, 0)]
        r, c = 0, 0
        for move in path:  # every move stays on the map and off the avoided tiles
            dr, dc = grid.MOVES[move]
            r, c = r + dr, c + dc
            assert 0 <= r < rows and 0 <= c < cols and desc[r][c] not in "HT"
        assert desc[r][c] == "G"
    assert found > 20


def test_bfs_breaks_ties_in_move_order_and_walking_stops_at_edges():
    assert grid.shortest_path(["SF", "FG"], 0, 0, avoid="H") == ["down", "right"]  # down is tried before right
    assert grid.shortest_path(["SH", "HG"], 0, 0, avoid="H") is None
    assert grid.walk((0, 0), ["up", "left", "right", "down", "down"], 2) == [(0, 0), (0, 0), (0, 0), (0, 1), (1, 1),
                                                                          (1, 1)]
    assert grid.neighbours(["SFF", "FFG"], 0, 2) == {"left": (0, 1), "down": (1, 2), "right": None, "up": None}


def test_both_envs_render_through_the_grid_and_read_back():
    desc = ["SFH", "FTF", "HFG"]
    assert frozenlake.render(["SFH", "FFF", "HFG"], 2, 2) == "__O\n___\nO_√"
    assert thin_ice.render(desc, 1, 1) == "__O\n_X_\nO_G"
    assert grid.read_map("__O\n_P_\nO_G", {"_": "F", "O": "H", "G": "G", "P": "F"}, player="P") == (
        ["FFH", "FFF", "HFG"], (1, 1))
    assert grid.read_map("_P\n_P", {"_": "F", "P": "F"}, player="P") is None  # two players
    assert grid.read_map("_P\n_", {"_": "F", "P": "F"}, player="P") is None  # ragged rows


def test_the_envs_solvers_are_the_grids_search():
    rng = random.Random(0)
    for _ in range(50):
        desc = random_map(rng, 5, 5)
        assert thin_ice.safe_plan(desc, 0, 0) == grid.shortest_path(desc, 0, 0, avoid="HT")
        assert thin_ice.naive_plan(desc, 0, 0) == grid.shortest_path(desc, 0, 0, avoid="H")
        assert frozenlake.shortest_path(desc, 0, 0) == grid.shortest_path(desc, 0, 0, avoid="H")
