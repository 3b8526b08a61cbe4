"""kvq eval past one machine: (text window, pair) units in a plan that kvq's C++ side reads
(experiments/cluster/work_plan.hpp: the same JSON, the same cost-balanced split), one shard's run
with each finished pair saved atomically, and the rows of a checked merge.

    kvq plan eval --shards N --out STUDY --model stories260k ...   (kvq_eval.py --plan-out)
    kvq_eval.py --plan STUDY/plan.json --shard I --out STUDY/shards/I
    kvq merge STUDY/shards/* --out STUDY/results                   (kvq_eval.py --merge-units)
"""
import datetime
import json
import math
import os
import platform

# kvq_eval.py options a plan fixes: every shard runs with the planner's values
SETTINGS = ("model", "tokenizer", "text", "max_tokens", "rope_order", "k", "v", "sweep", "device", "torch_dtype",
            "attention", "decode_variant", "no_plot", "engine", "ctx", "gpus", "seed", "precision",
            "runtime")


def shard_assignment(units, count):
    """work_plan.cpp's split: a unit goes to the shard its cost midpoint falls in, per group."""
    total, before, out = {}, {}, []
    for u in units:
        total[u["group"]] = total.get(u["group"], 0.0) + u["cost"]
    for u in units:
        mid = before.get(u["group"], 0.0) + u["cost"] / 2
        before[u["group"]] = before.get(u["group"], 0.0) + u["cost"]
        out.append(min(count - 1, int(math.floor(count * mid / total[u["group"]]))))
    return out


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def make_plan(args, source, tokens, pairs, shards):
    """The evaluated tokens (every --ctx window of them) x every pair; a pair's cost is one model run
    per window."""
    window = f"0:{tokens}"
    units = [{"id": f"w0-{k}__{v}", "group": "", "cost": 1.0, "key": {"window": window, "k": k, "v": v}}
             for k, v in pairs]
    for u, s in zip(units, shard_assignment(units, shards)):
        u["shard"] = s
    settings = {name: getattr(args, name) for name in SETTINGS}
    settings.update({"source": source, "tokens": tokens})
    return {"kvq_plan": 1, "kind": "eval", "shards": shards, "settings": settings, "units": units}


def write_plan(plan, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomically(path, json.dumps(plan, indent=1) + "\n")
    print(f"{path}: eval plan, {len(plan['units'])} units in {plan['shards']} shard(s)")
    for s in range(plan["shards"]):
        print(f"  shard {s}: {sum(u['shard'] == s for u in plan['units'])} units")


def read_plan(path):
    with open(path) as f:
        plan = json.load(f)
    if plan.get("kvq_plan") != 1 or plan.get("kind") != "eval":
        raise ValueError(f"{path}: not a kvq eval plan (kind {plan.get('kind')!r})")
    return plan


def parse_shard(text, plan_shards):
    index, _, count = text.partition("/")
    try:
        index, count = int(index), int(count) if count else plan_shards
    except ValueError:
        raise ValueError(f"--shard '{text}': expected I/N or I (shard I of N, 0 <= I < N)") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard '{text}': expected 0 <= I < N, got I = {index}, N = {count}")
    return index, count


def task_info():
    slurm = {k: os.environ.get(v, "") for k, v in (("job", "SLURM_JOB_ID"), ("array_job", "SLURM_ARRAY_JOB_ID"),
                                                    ("array_task", "SLURM_ARRAY_TASK_ID"), ("node", "SLURMD_NODENAME"))}
    info = {"host": platform.node(), "pid": os.getpid(),
            "time_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if slurm["job"]:
        info["slurm"] = slurm
    return info


class ShardDir:
    """DIR/plan.json, DIR/units/ID.json (one per finished unit), DIR/shard.json: as work_plan.hpp."""

    def __init__(self, path, plan):
        self.path = path
        os.makedirs(os.path.join(path, "units"), exist_ok=True)
        plan_path = os.path.join(path, "plan.json")
        if os.path.exists(plan_path):
            with open(plan_path) as f:
                if json.load(f) != plan:
                    raise ValueError(f"{path}: holds the results of another plan (its plan.json differs): give this "
                                     "shard a folder of its own")
        else:
            write_atomically(plan_path, json.dumps(plan, indent=1) + "\n")

    def result(self, unit):
        try:
            with open(os.path.join(self.path, "units", unit["id"] + ".json")) as f:
                j = json.load(f)
            return j["result"] if j.get("unit") == unit["id"] and j.get("key") == unit["key"] else None
        except (OSError, ValueError, KeyError):
            return None

    def save(self, unit, result, ran):
        text = json.dumps({"unit": unit["id"], "key": unit["key"], "ran": ran, "result": result})
        write_atomically(os.path.join(self.path, "units", unit["id"] + ".json"), text + "\n")

    def record_run(self, label, ran, reused, seconds, task):
        path = os.path.join(self.path, "shard.json")
        runs = json.load(open(path)) if os.path.exists(path) else []
        runs.append({**task, "shard": label, "ran": ran, "reused": reused, "seconds": seconds})
        write_atomically(path, json.dumps(runs, indent=1) + "\n")
