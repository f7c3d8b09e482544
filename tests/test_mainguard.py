"""Which starts of a spawn/forkserver process a rank refuses (pyrunner/mainguard.py): those that the
new process's own run of the script would make again, after joining the process group. The whole
job is tested in test_quick.py; here the rule, line by line, on scripts as users write them."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchjob.pyrunner import mainguard

UNGUARDED = """\
import os
import torch.distributed as dist
dist.init_process_group("gloo")
loader = make_loader()
for batch in loader:
    step(batch)
if dist.get_rank() == 0:
    for batch in loader:
        evaluate(batch)
try:
    list(loader)
except KeyboardInterrupt:
    list(loader)
with open("log") as log:
    list(loader)
if os.environ.get("MY_CHILD") is None:
    list(loader)
def main():
    list(loader)
main()
"""


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        (5, True),  # a for's header: the worker's run of the script gets there
        (8, True),  # under a condition the worker's run sees alike (the same rank, argv, env)
        (11, True),  # a try's body
        (13, True),  # an except clause
        (15, True),  # a with's body
        (17, False),  # under an if that reads the environment: a flag the parent may have set
        (19, False),  # a def's body is not the top level (the frame refused is <module>'s)
        (20, True),  # the top-level call that got there
        (3, True),
    ],
)
def test_a_script_without_a_guard_is_refused_where_every_run_gets(
    tmp_path: Path, line: int, refused: bool
) -> None:
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    assert mainguard.unguarded(str(script), line) is refused


@pytest.mark.parametrize(
    "guard",
    [
        'if __name__ == "__main__":\n    pass\n',
        "import multiprocessing\nif multiprocessing.parent_process() is None:\n    pass\n",
        "from multiprocessing import current_process\nprint(current_process().name)\n",
        "from multiprocessing import freeze_support\nfreeze_support()\n",
    ],
)
def test_a_script_that_names_a_guard_anywhere_is_left_to_python(tmp_path: Path, guard: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED + guard)
    assert not mainguard.unguarded(str(script), 5)
