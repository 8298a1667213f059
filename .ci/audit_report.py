"""Read pip-audit's JSON report for .ci/audit: fail on a vulnerability not ignored, say loudly
what could not be audited (and pass), say what was.

Usage: audit_report.py REPORT_JSON PIP_AUDIT_EXIT_CODE PIP_AUDIT_STDERR
"""

import json
import sys
from pathlib import Path

report, rc, stderr = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
if not report.exists() or not report.read_text().strip():
    tail = [line for line in stderr.read_text().splitlines() if "Location" not in line][-5:]
    print("pip-audit: NOT AUDITED: pip-audit could not run or reach its vulnerability service:")
    print("\n".join(f"  {line}" for line in tail))
    sys.exit(0)
dependencies = json.loads(report.read_text())["dependencies"]
vulnerable = [dep for dep in dependencies if dep.get("vulns")]
skipped = [dep for dep in dependencies if dep.get("skip_reason")]
for dep in vulnerable:
    for vuln in dep["vulns"]:
        fixes = ", ".join(vuln.get("fix_versions") or []) or "no fixed release"
        print(f"pip-audit: VULNERABLE {dep['name']}=={dep['version']}: {vuln['id']} (fixed in {fixes})")
if skipped:
    print(
        f"pip-audit: NOT AUDITED: {len(skipped)} of {len(dependencies)} pinned packages: the "
        "vulnerability service had no answer for these versions (unreachable from this network?), e.g."
    )
    for dep in skipped[:3]:
        print(f"  {dep['name']}: {dep['skip_reason']}")
audited = len(dependencies) - len(skipped)
print(f"pip-audit: {audited} packages audited, {len(vulnerable)} with known vulnerabilities not ignored")
if vulnerable:
    print("Bump the pin in requirements.txt, or list the ID in .ci/pip-audit-ignore.txt with a reason.")
    sys.exit(1)
if rc not in (0, 1):
    print(f"pip-audit exited {rc}")
