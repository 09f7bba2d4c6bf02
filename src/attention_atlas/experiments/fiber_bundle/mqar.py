"""The MQAR half of the matched comparison (issue 53, item 4): the unregularised Fiber Bundle
Transformer against dot-product models matched in parameters, training FLOPs and wall clock on
multi-query associative recall, at chapter 9's centre cell and by its protocol
(:mod:`attention_atlas.experiments.zoo.run`: width 64, 4 pairs, 32 tokens, a vocabulary of 64,
300 steps of 32 sequences, token shift, no MLP, untied embeddings, each arm's learning rate
chosen from ``lrs`` by validation accuracy at one seed, :func:`~attention_atlas.experiments.zoo.run.select_lr`).

:func:`mqar_grid` builds the cells (``kind = "mqar"``, the ``gate-mqar`` preset of the
fiber-bundle experiment), :func:`run_mqar_cell` trains one and measures test accuracy, and for
the Fiber Bundle model also the geometry gate on MQAR: the drop of test accuracy when the
Riemannian score is blended out (``alpha -> 0``) and when every metric factor is zero
(``U -> 0``). :func:`check_mqar_cell` checks a cell before any work.
"""

from __future__ import annotations

import math
from typing import Any

from attention_atlas.validate import ConfigError, check_count, check_number, one_line

from .controls import flop_ratio, matched_dot_width

__all__ = [
    "MQAR_ARMS",
    "MQAR_COMMAND",
    "MQAR_KIND",
    "MQAR_LONG",
    "MQAR_LONG_COMMAND",
    "MQAR_TIME_BUDGET_S",
    "mqar_command",
    "check_mqar_cell",
    "mqar_grid",
    "run_mqar_cell",
    "stored_zoo_cell",
]

#: the cell kind of the MQAR comparison (the char-PTB grid's kinds are ``dot`` and ``fbt``)
MQAR_KIND = "mqar"
#: arm -> what it is matched in (``dot`` is the same width, the chapter-9 control)
MQAR_ARMS = {"fbt_reg-none": "the model", "dot": "width", "dot_params": "parameters",
             "dot_flops": "training FLOPs", "dot_time": "wall clock"}  # fmt: skip
#: the wall-clock budget of the time-matched dot arm: the training time of the unregularised
#: Fiber Bundle model at chapter 9's centre cell measured here (one CPU thread on an otherwise
#: idle core, seed 0, lr 1e-3, the learning rate its selection chose: 17.3 s for 300 steps)
MQAR_TIME_BUDGET_S = 18.0
#: the command that runs the ``gate-mqar`` preset
MQAR_COMMAND = (
    "python -m attention_atlas sweep fiber-bundle --preset gate-mqar --seeds 0 1 2 3 4 "
    "--workers 1 --threads 1"
)
#: the ``gate-mqar-long`` preset's :func:`mqar_grid` settings: chapter 9's ``long`` protocol
#: (64 tokens, a vocabulary of 512, 1,000 steps of 32 sequences) at its hardest stored cell for
#: the dot-product baseline, width 32 and 8 pairs, where the stored zoo grid has dot at 0.32 to
#: 0.50 test accuracy (3 seeds), far from the ceiling the centre cell saturates. The time budget
#: is the unregularised Fiber Bundle model's training time there, measured here (one CPU thread
#: on an otherwise idle machine, seed 0, lr 1e-3: 78.6 s for 1,000 steps)
MQAR_LONG = {"width": 32, "pairs": 8, "seq_len": 64, "vocab_size": 512, "steps": 1000,
             "log_every": 100, "time_budget_s": 80.0}  # fmt: skip
#: the command that runs the ``gate-mqar-long`` preset
MQAR_LONG_COMMAND = MQAR_COMMAND.replace("gate-mqar", "gate-mqar-long")


def mqar_command(preset: str | None) -> str:
    """The command that runs the MQAR comparison's grid ``preset`` (``gate-mqar`` by default)."""
    return MQAR_LONG_COMMAND if preset == "gate-mqar-long" else MQAR_COMMAND


def mqar_grid(
    *,
    width: int = 64,
    pairs: int = 4,
    seq_len: int = 32,
    vocab_size: int = 64,
    n_layers: int = 2,
    n_heads: int = 1,
    steps: int = 300,
    batch_size: int = 32,
    lrs: tuple[float, ...] | list[float] = (1e-3, 3e-3, 1e-2),
    select_seed: int = 0,
    n_train: int = 50_000,
    n_val: int = 1_000,
    n_test: int = 1_000,
    log_every: int = 50,
    time_budget_s: float = MQAR_TIME_BUDGET_S,
) -> dict[str, dict[str, Any]]:
    """The cells of the MQAR comparison, one per arm of :data:`MQAR_ARMS`: ``fbt_reg-none``
    (the Fiber Bundle Transformer, no geometric regulariser: chapter 9's ``fiber_bundle`` arm),
    ``dot`` at the same width, ``dot_params`` as wide as the Fiber Bundle model's parameter
    count allows (:func:`~.controls.matched_dot_width`), ``dot_flops`` trained for more steps by
    the counted ratio of training FLOPs (:func:`~.controls.flop_ratio`, the warm-up scaled
    alike) and ``dot_time`` trained for ``time_budget_s`` (``schedule="time"``, the steps a cap it
    does not reach). Each cell carries its learning-rate selection: the arm itself at each of
    ``lrs`` on ``select_seed`` (chapter 9's protocol), so a cell is self-contained."""
    from attention_atlas.experiments.zoo.run import NO_MLP, quiet_no_mlp

    length = max(seq_len, 4 * pairs)
    model = {"dim": int(width), "n_layers": n_layers, "n_heads": n_heads, "max_len": length,
             "tie_embeddings": False, "mlp_ratio": NO_MLP, "token_shift": True}  # fmt: skip
    task = {"seq_len": length, "n_pairs": int(pairs), "vocab_size": vocab_size,
            "query_dist": "power", "n_train": n_train, "n_val": n_val, "n_test": n_test}  # fmt: skip
    train = {"steps": steps, "batch_size": batch_size, "warmup_steps": max(1, steps // 10),
             "log_every": log_every, "eval_batches": 2, "eval_batch_size": 250}  # fmt: skip
    with quiet_no_mlp():  # blocks without MLP
        ratio = flop_ratio(model, batch_size, length, vocab_size)
        width_params = matched_dot_width(model, vocab_size)
    flop_steps = int(round(steps * ratio))
    arms: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
        "fbt_reg-none": ("fiber_bundle", model, train),
        "dot": ("dot", model, train),
        "dot_params": ("dot", {**model, "dim": width_params}, train),
        "dot_flops": ("dot", model, {**train, "steps": flop_steps,
                                     "warmup_steps": max(1, flop_steps // 10)}),
        "dot_time": ("dot", model, {**train, "steps": 100 * steps, "schedule": "time",
                                    "max_time_s": float(time_budget_s)}),
    }  # fmt: skip
    return {
        name: {"kind": MQAR_KIND, "arm": name, "variant": variant, "model": m, "task": task,
               "train": t, "flop_ratio": ratio,
               "selection": {"lrs": [float(x) for x in lrs], "seed": int(select_seed)}}
        for name, (variant, m, t) in arms.items()
    }  # fmt: skip


def stored_zoo_cell(width: int, pairs: int, preset: str = "long") -> dict[str, dict[str, Any]]:
    """Chapter 9's stored MQAR cell ``w<width>-p<pairs>`` of its ``preset`` grid, for the
    dot-product and Fiber Bundle arms: per variant the learning rate (chapter 9 chooses it at its
    centre cell) and the test accuracy over seeds (``mean``, ``min``, ``max``, ``seeds``). Empty
    when that grid or cell is not stored."""
    from attention_atlas.store.results import load_grid

    try:
        grid = load_grid("zoo", preset, complete=False, skip_damaged=True)
    except FileNotFoundError:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for variant in ("dot", "fiber_bundle"):
        config = f"mqar/{variant}/w{int(width)}-p{int(pairs)}"
        recs = [r for (c, _), r in grid.records.items() if c == config]
        accs = [float(r["test_acc"]) for r in recs if r.get("test_acc") is not None]
        if accs:
            out[variant] = {"lr": float(recs[0]["lr"]), "mean": sum(accs) / len(accs),
                            "min": min(accs), "max": max(accs), "seeds": len(accs)}  # fmt: skip
    return out


def _configs(params: dict[str, Any], lr: float, seed: int) -> tuple[Any, Any]:
    from attention_atlas.experiments.zoo.run import mqar_configs

    return mqar_configs(params["variant"], params["model"], params["task"], params["train"],
                        None, lr, seed)  # fmt: skip


def run_mqar_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Select the arm's learning rate (:func:`~attention_atlas.experiments.zoo.run.select_lr`,
    memoised), train the cell at it on MQAR drawn from ``seed`` (initialised from ``seed``) and
    measure: ``val_acc``, ``test_acc`` (value positions only), ``steps_done``, the training
    time, the parameter count, ``lr`` and the selection's accuracies; for the Fiber Bundle model
    also the gate: ``acc_own`` (test accuracy again), ``acc_at_alpha_0``, ``acc_at_u0`` and
    ``gate_acc_alpha0`` / ``gate_acc_u0``, the accuracy lost when the geometry is removed
    (``acc_own`` minus each). A diverged run records ``diverged_step`` and NaN accuracies."""
    from attention_atlas.data import mqar_task
    from attention_atlas.experiments.zoo.run import quiet_no_mlp, select_lr
    from attention_atlas.models.fiber_bundle import evaluated_at_alpha, evaluated_without_metric
    from attention_atlas.train import evaluate, train

    sel = params["selection"]
    selection = {"lrs": sel["lrs"], "seed": sel["seed"],
                 **{k: params[k] for k in ("model", "task", "train")}}  # fmt: skip
    scores = select_lr(params["variant"], selection, None)
    lr = max(sel["lrs"], key=lambda x: (scores[f"{x:g}"], -x))  # ties: the smaller lr
    data = mqar_task(**params["task"], seed=seed)
    mcfg, tcfg = _configs(params, lr, seed)
    with quiet_no_mlp():
        res = train(mcfg, tcfg, data)
    out: dict[str, Any] = {
        "arm": params["arm"], "variant": params["variant"], "lr": lr,
        **{f"select_val_acc@{k}": v for k, v in scores.items()},
        "val_acc": res.final["val_acc"], "test_acc": res.final["test_acc"],
        "steps_done": int(res.final.get("steps") or tcfg.steps),
        "train_time_s": res.final["train_time_s"], "train_cpu_s": res.final["train_cpu_s"],
        "params_total": res.record["param_counts"]["total"],
    }  # fmt: skip
    if res.diverged is not None:
        out["diverged_step"] = int(res.diverged["step"])
        return out
    if params["variant"] == "fiber_bundle":  # the geometry gate, on the test split

        def acc() -> float:
            return float(evaluate(res.model, data, split="test",
                                  batch_size=tcfg.eval_batch_size)["acc"])  # fmt: skip

        out["acc_own"] = acc()
        with evaluated_at_alpha(res.model, 0.0):
            out["acc_at_alpha_0"] = acc()
        with evaluated_without_metric(res.model):
            out["acc_at_u0"] = acc()
        out["gate_acc_alpha0"] = out["acc_own"] - out["acc_at_alpha_0"]
        out["gate_acc_u0"] = out["acc_own"] - out["acc_at_u0"]
    return out


def check_mqar_cell(params: dict[str, Any]) -> None:
    """Check an MQAR cell of :func:`mqar_grid` before any work: its arm and variant (the Fiber
    Bundle arm ``fiber_bundle``, every other ``dot``), the task
    (:func:`~attention_atlas.data.mqar.check_mqar`, split sizes), the learning rates and
    selection seed, the time budget of a time schedule, and the model and run at every
    learning rate through :func:`~attention_atlas.train.config.check_model` and
    :func:`~attention_atlas.train.config.check_run`. Raises ConfigError (one line)."""
    from attention_atlas.data.mqar import check_mqar
    from attention_atlas.experiments.zoo.run import quiet_no_mlp
    from attention_atlas.train.config import check_model, check_run

    arm, variant = params.get("arm"), params.get("variant")
    if arm not in MQAR_ARMS:
        raise ConfigError(f"arm: expected one of {', '.join(MQAR_ARMS)}, got {arm!r}")
    want = "fiber_bundle" if arm == "fbt_reg-none" else "dot"
    if variant != want:
        raise ConfigError(f"variant: the {arm} arm is {want!r}, got {variant!r}")
    task = params["task"]
    check_mqar(task["seq_len"], task["n_pairs"], task["vocab_size"], task["query_dist"], 0.01)
    for key in ("n_train", "n_val", "n_test"):
        check_count(key, task[key])
    sel = params.get("selection") or {}
    lrs = sel.get("lrs")
    if not isinstance(lrs, list) or not lrs:
        raise ConfigError(f"lrs: expected a non-empty list, got {lrs!r}")
    for lr in lrs:
        check_number("lrs", lr)
    check_count("select_seed", sel.get("seed"), least=0)
    if params["train"].get("schedule") == "time":
        check_number("time_budget_s", params["train"].get("max_time_s"))
    ratio = params.get("flop_ratio")
    if not isinstance(ratio, float) or not math.isfinite(ratio) or ratio < 1.0:
        raise ConfigError(f"flop_ratio: expected a number >= 1 (the Fiber Bundle model's share), "
                          f"got {ratio!r}")  # fmt: skip
    try:
        configs = [_configs(params, float(lr), 0) for lr in lrs]
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model settings: {one_line(err)}") from None
    with quiet_no_mlp():  # a block without MLP, built on the meta device
        check_model(configs[0][0])
    for _, tcfg in configs:
        check_run(tcfg)
