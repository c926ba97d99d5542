"""Sampling metrics over ``n`` samples per prompt: unbiased pass@k and avg@k.

pass@k (Chen et al. 2021, https://arxiv.org/abs/2107.03374, Codex paper, Fig. 3) is the
probability that at least one of ``k`` samples drawn without replacement from the ``n``
generated ones is correct: ``1 - C(n-c, k) / C(n, k)``. The binomials overflow and lose
precision for large ``n``, so we use the product form ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct.

    Args:
        n: samples generated for the prompt.
        c: correct samples among them.
        k: samples the metric imagines drawing, ``1 <= k <= n``.

    Returns:
        ``1 - C(n-c, k) / C(n, k)``.

    Raises:
        ValueError: ``k`` outside ``[1, n]`` or ``c`` outside ``[0, n]``.

    >>> pass_at_k(4, 1, 1)
    0.25
    >>> pass_at_k(4, 1, 4)
    1.0
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def avg_at_k(correct: Sequence[bool | float]) -> float:
    """Mean correctness of one prompt's samples (avg@k with ``k = len(correct)``)."""
    if not correct:
        raise ValueError("avg@k needs at least one sample")
    return sum(float(x) for x in correct) / len(correct)


def sample_metrics(groups: Sequence[Sequence[bool]], ks: Sequence[int] = (),
                   prefix: str = "val/") -> dict[str, float]:
    """Validation metrics over prompts, each with ``k`` sampled responses judged correct or not.

    Keys follow docs/metrics.md: ``avg@k`` and ``pass@k`` carry a literal ``k`` (the number of
    samples per prompt, recorded in the run's config), so a run's headline metric keeps one name
    whatever ``k`` is; ``ks`` adds numbered ``pass@j`` keys (``val/pass@1``) for ``j <= k``.

    Args:
        groups: one sequence of per-sample correctness per prompt; all of the same length ``k``.
        ks: extra ``j`` values to report as ``pass@j``.
        prefix: key prefix.

    Returns:
        ``{prefix + "avg@k": ..., prefix + "pass@k": ..., prefix + "pass@j": ...}``, each a mean
        over prompts.

    Raises:
        ValueError: no groups, or groups of different sizes (the metrics would mix different ``k``).

    >>> sample_metrics([[True, False], [False, False]], ks=(1,))
    {'val/avg@k': 0.25, 'val/pass@k': 0.5, 'val/pass@1': 0.25}
    """
    if not groups:
        raise ValueError("sample_metrics needs at least one prompt")
    n = len(groups[0])
    if any(len(g) != n for g in groups):
        sizes = sorted({len(g) for g in groups})
        raise ValueError(f"all prompts need the same number of samples; got sizes {sizes}")
    counts = [sum(bool(x) for x in g) for g in groups]
    out = {f"{prefix}avg@k": sum(counts) / (n * len(groups)),
           f"{prefix}pass@k": sum(pass_at_k(n, c, n) for c in counts) / len(groups)}
    for j in ks:
        if j <= n:
            out[f"{prefix}pass@{j}"] = sum(pass_at_k(n, c, j) for c in counts) / len(groups)
    return out


def feature_metrics(task: object, items: Sequence, texts: Sequence[str], correct: Sequence[bool],
                    prefix: str) -> dict[str, float]:
    """Share and accuracy of each response feature a task names, e.g. the answer mode of ``addition``.

    A task may define ``response_features(item, text) -> dict[str, bool]`` with the same keys for every
    response; for each key this gives ``<prefix>/<key>/share`` (the fraction of responses that have it) and,
    when any does, ``<prefix>/<key>/accuracy`` (the fraction of those that are correct). The ARMOR study reads
    them to see which way of answering a policy keeps (docs/methods/armor.md). Tasks without the method: ``{}``.
    """
    describe = getattr(task, "response_features", None)
    if describe is None or not texts:
        return {}
    flags = [describe(item, text) for item, text in zip(items, texts, strict=True)]
    out: dict[str, float] = {}
    for key in flags[0]:
        having = [ok for flag, ok in zip(flags, correct, strict=True) if flag[key]]
        out[f"{prefix}/{key}/share"] = len(having) / len(flags)
        if having:
            out[f"{prefix}/{key}/accuracy"] = sum(having) / len(having)
    return out
