"""submit-lua: what job_submit.lua costs slurmctld on the largest script a user can send.

The real plugin, under lua5.1 (what Debian's Slurm links), through the test harness that
calls it as the job_submit/lua plugin does: a 4 MiB hostile script (its header full of
long runs of blanks and tabs on comment and directive lines, long quoted and unquoted
words, then blanks to 4 MiB) against a plain 4 MiB script (a header of ordinary comments
as long as the plugin reads, then commands), alternating, medians of the plugin call's
CPU time. Goals: <= 100 ms on the hostile script and a hostile/plain ratio <= 2: no
input makes it slower than its size says.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.bench.timing import alternate
from tests.fixtures.lua.luarun import HARNESS, PLUGIN

SIZE = 4 * 1024 * 1024
# Lua expressions, so that the cases file stays small: the scripts are built in Lua.
HOSTILE = (
    '(function() local head = "#!/bin/bash\\n" .. string.rep("#" .. string.rep(" \\t", 16384)'
    ' .. "x\\n#JOBWRAP --checkpoint-marker=\'" .. string.rep("m", 8192) .. "\'"'
    ' .. string.rep(" ", 16384) .. "--checkpoint-dir=" .. string.rep("c\\\\ ", 4096) .. "c"'
    ' .. string.rep("\\t", 8192) .. "\\n", 4)'
    f' return head .. "#" .. string.rep(" ", {SIZE} - #head - 12) .. "\\necho done\\n" end)()')
# The anchor: a plain script of the same size whose header is as long as the caps let
# the plugin read (1000 comment lines of ordinary words, 256 KiB), then commands. The
# ratio compares the cost of a hostile byte with the cost of an ordinary one.
PLAIN = (
    '(function() local head = "#!/bin/bash\\n#SBATCH --time=10\\n#JOBWRAP --max-restarts=2\\n"'
    ' .. string.rep("# " .. string.rep("an ordinary comment, ", 12) .. "\\n", 1000)'
    f' return head .. string.rep("echo plain step\\n", ({SIZE} - #head) / 16) end)()')


def _cases(script: str) -> str:
    return ('return { { timed = true, fields = { requeue = 65534, time_limit = 60, '
            f'user_id = 1000, script = {script} }} }} }}\n')


def main() -> int:
    lua = shutil.which("lua5.1")
    if lua is None:
        print("submit-lua: lua5.1 is missing (apt-get install -y lua5.1)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, script in (("hostile", HOSTILE), ("plain", PLAIN)):
            files[name] = Path(tmp) / f"{name}.lua"
            files[name].write_text(_cases(script))

        def call(name: str) -> float:
            proc = subprocess.run([lua, str(HARNESS), str(PLUGIN), str(files[name])],
                                  capture_output=True, check=True, timeout=600)
            result = json.loads(proc.stdout)[0]
            if result.get("rc") != 0 or "crash" in result:
                raise AssertionError(f"{name}: {str(result.get('crash') or '')[:300]} "
                                     f"{str(result.get('user_msg') or '')[:300]}")
            return float(result["seconds"])

        hostile, plain = alternate(lambda: call("hostile"), lambda: call("plain"),
                                   rounds=21, warmup=2)
    ratio = hostile / plain
    print(f"submit-lua: job_submit.lua under lua5.1, 4 MiB hostile script median "
          f"{hostile * 1000:.2f} ms, plain 4 MiB script median {plain * 1000:.2f} ms "
          f"(ratio {ratio:.2f}, goal<=2)")
    print(f"submit-lua ms={hostile * 1000:.2f} ratio={ratio:.2f} goal<=100")
    return 0 if hostile * 1000 <= 100 and ratio <= 2 else 1
