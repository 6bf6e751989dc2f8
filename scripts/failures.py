"""Prints the failed tests of nextest's JUnit reports, each with the tail of its output.

scripts/test runs a whole workspace in parts; this lists every part's failures together at the
end of the log, where CI keeps it.  Usage: failures.py REPORT.xml [REPORT.xml ...]
"""

import os
import sys
import xml.etree.ElementTree as ET

# A test's message ends its stderr (a panic, or the Err a test returned); its stdout's last log
# lines give the context.
TAIL_LINES = {"system-out": 20, "system-err": 40}


def tail(text, lines):
    kept = (text or "").rstrip().splitlines()
    return "\n".join(kept[-lines:])


def main(paths):
    failures = []
    # A part that failed before running its tests left no report (nor does a glob that matched none).
    for path in filter(os.path.exists, paths):
        for suite in ET.parse(path).getroot().iter("testsuite"):
            for case in suite.iter("testcase"):
                failure = case.find("failure")
                if failure is None:
                    failure = case.find("error")
                if failure is not None:
                    failures.append((suite.get("name"), case, failure))
    print(f"\n==== {len(failures)} failed test(s) ====")
    for suite, case, failure in failures:
        print(f"\n---- {suite} {case.get('name')}: {failure.get('message', '')}")
        for stream, lines in TAIL_LINES.items():
            text = tail(case.findtext(stream), lines)
            if text:
                print(f"[{stream}, last {lines} lines]\n{text}")
    for suite, case, _ in failures:
        print(f"FAILED: {suite} {case.get('name')}")


if __name__ == "__main__":
    main(sys.argv[1:])
