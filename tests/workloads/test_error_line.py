"""The program's own error line (autotune.workloads.error_line), on output shaped like a
real torchrun run's: rank-prefixed tracebacks, then torchrun's ChildFailedError summary."""

from __future__ import annotations

from autotune.workloads.error_line import program_error_line, signature

# The shape of a 2-rank pretrain_gpt.py that failed in gloo under an address-space limit
# (torch 2.13's torchrun with rank prefixes), abridged.
TORCHRUN = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "pretrain_gpt.py", line 8, in <module>
[rank1]:     backend_class = ProcessGroupGloo(
[rank1]:                     ^^^^^^^^^^^^^^^^^
[rank1]: RuntimeError: Resource temporarily unavailable
W1201 19:24:03.729000 26169 torch/distributed/elastic/multiprocessing/api.py:1028] Sending \
process 26312 closing signal SIGTERM
Traceback (most recent call last):
  File "torch/distributed/run.py", line 1028, in main
    run(args)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
pretrain_gpt.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 26313)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
ARGPARSE = """\
usage: pretrain_gpt.py [-h] [--num-layers NUM_LAYERS]
pretrain_gpt.py: error: unrecognized arguments: --hiden-dropout 0.1
"""


def test_the_rank_s_exception_not_torchrun_s_summary() -> None:
    assert program_error_line(TORCHRUN) == "RuntimeError: Resource temporarily unavailable"


def test_an_argparse_error_is_the_line() -> None:
    assert program_error_line(ARGPARSE + TORCHRUN.split("W1201")[1]) == \
        "pretrain_gpt.py: error: unrecognized arguments: --hiden-dropout 0.1"


def test_the_rank_error_files_come_first_and_nothing_is_invented() -> None:
    # A bare line without a traceback header is no exception: the next text is read.
    assert program_error_line(["ValueError: no header"], TORCHRUN) == \
        "RuntimeError: Resource temporarily unavailable"
    rank_file = "Traceback (most recent call last):\n  File x\nValueError: from the rank\n"
    assert program_error_line([rank_file], TORCHRUN) == "ValueError: from the rank"
    assert program_error_line("all fine\nexit 0\n") is None
    killed = "Traceback (most recent call last):\n  File x\nKeyboardInterrupt\n"
    assert program_error_line(killed) is None


def test_signatures_of_one_failure_on_two_layouts_are_equal() -> None:
    a = "RuntimeError: shape '[2, 64, 4, 16]' is invalid for input of size 8192"
    b = "[rank3]: RuntimeError: shape '[4, 64, 2, 32]' is invalid for input of size 16384"
    assert signature(a) == signature(b)
    assert signature(a) != signature("ValueError: shape '[2]' is invalid")
