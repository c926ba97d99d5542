"""A reward function written for verl: ``custom_reward_function.path`` names a file like this one, and verl calls
``compute_score`` once per response. tether calls it the same way through ``tether.rewards:VerlScore``.

``solution_str`` is the response text, ``ground_truth`` the row's gold answer, ``data_source`` and ``extra_info`` the
row's columns of those names (``None`` when the data has none). The return value is a float, or a dict whose
``"score"`` is the reward.
"""

import re

NUMBER = re.compile(r"-?\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0):
    """1.0 when the last number of the response is the ground truth; ``format_score`` when the response has a
    number but the wrong one; 0.0 when it has none."""
    numbers = NUMBER.findall(solution_str)
    if not numbers:
        return 0.0
    return 1.0 if numbers[-1] == str(ground_truth).strip() else format_score
