"""Compare pytest -rA logs of PyTorch's distributed suite for gloo and collie.

    compare.py GLOO_LOG COLLIE_LOG [KNOWN]

Prints passed/failed/skipped for both and every test gloo passes that
collie does not; exits 1 if such a test is not in KNOWN (lines
"test_name  reason"), the named list of features collie does not have."""

import re
import sys


def outcomes(path):
    """test name -> (outcome, skip reason) from a pytest -v -rA log."""
    res = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"^\S*::(test_\w+) (PASSED|FAILED|ERROR|SKIPPED)(?: \((.*)\))?", line)
            if m:
                res[m.group(1)] = (m.group(2), m.group(3) or "")
                continue
            m = re.match(r"^(PASSED|FAILED|ERROR) \S*::(test_\w+)", line)
            if m:
                res[m.group(2)] = (m.group(1), "")
    summary = ""
    with open(path, errors="replace") as f:
        for line in f:
            if re.search(r"\d+ (passed|failed|skipped)", line) and " in " in line:
                summary = line.strip().strip("=").strip()
    return res, summary


def counts(summary):
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}


def main():
    gloo, gsum = outcomes(sys.argv[1])
    ours, csum = outcomes(sys.argv[2])
    known = {}
    if len(sys.argv) > 3:
        with open(sys.argv[3]) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    name, _, why = line.partition(" ")
                    known[name] = why.strip()
    g, c = counts(gsum), counts(csum)
    print(f"gloo:   {g.get('passed', 0)} passed, {g.get('failed', 0) + g.get('error', 0)} failed, "
          f"{g.get('skipped', 0)} skipped")
    print(f"collie: {c.get('passed', 0)} passed, {c.get('failed', 0) + c.get('error', 0)} failed, "
          f"{c.get('skipped', 0)} skipped")
    bad = gated = 0
    for name in sorted(n for n, o in gloo.items() if o[0] == "PASSED"):
        state, reason = ours.get(name, ("missing", ""))
        if state == "PASSED":
            continue
        why = known.get(name) or known.get(re.sub(r"_(autograd|torch)_profiler$", "", name))
        if why and why.startswith("suite:"):
            print(f"  gated by the suite for plugin backends: {name} ({why[6:].strip()})")
            gated += 1
        elif why:
            print(f"  known: {name} ({state} with collie): {why}")
        elif state == "SKIPPED" and re.search(r"backend (\S+ )?to be one of|only supported on|"
                                              r"Only Gloo|Only gloo|backends? (is|are) supported|"
                                              r"GLOO Batch Send Recv CPU", reason):
            # the suite itself runs it only for backends it names
            print(f"  gated by the suite for plugin backends: {name} ({reason})")
            gated += 1
        else:
            print(f"  NOT EXPLAINED: {name} passes with gloo, {state} with collie {reason}")
            bad += 1
    print(f"{gated} test(s) the suite runs only for named backends; {bad} not explained")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
