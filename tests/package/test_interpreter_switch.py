"""What importing gla_ref.triton on a machine without CUDA does to Triton and to the environment:
Triton interprets for this process, the variable that chose it does not leak to child processes
(where Triton has knobs), a user's own setting is kept, and importing Triton first is refused.
Each case runs in a fresh Python, since the choice is made once per process."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the switch acts only without CUDA")


def _python(code, **env):
    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=300)


def test_the_process_interprets_and_children_do_not_inherit_the_variable():
    run = _python("""
        import os, subprocess, sys
        import torch
        import gla_ref.triton as gt
        import triton
        from gla_ref import torch_ref
        from gla_ref.testing import as_torch, random_inputs, rel_rmse
        x = as_torch(random_inputs(1, 20, 2, 16, 24, gate="gla", seed=0))
        o = gt.chunk_gla(x["q"], x["k"], x["v"], x["g"], chunk_size=16)[0]
        assert rel_rmse(torch_ref.chunk_gla(x["q"], x["k"], x["v"], x["g"])[0], o) < 1e-5
        has_knob = hasattr(getattr(triton, "knobs", None), "runtime")
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('TRITON_INTERPRET'))"],
                               capture_output=True, text=True).stdout.strip()
        print(has_knob, os.environ.get("TRITON_INTERPRET"), child, triton.knobs.runtime.interpret if has_knob else None)
    """)
    assert run.returncode == 0, run.stderr[-2000:]
    has_knob, here, child, knob = run.stdout.split()[-4:]
    if has_knob == "True":
        assert (here, child, knob) == ("None", "None", "True")
    else:  # an older Triton: the variable is the only switch, and it stays
        assert (here, child) == ("1", "1")


def test_a_users_own_variable_is_left_alone():
    run = _python("""
        import os
        import gla_ref.triton
        print(os.environ.get("TRITON_INTERPRET"))
    """, TRITON_INTERPRET="1")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "1"


def test_importing_triton_first_still_interprets():
    """Triton imported first, in compiled mode (AdamW and FLA do it): gla_ref.triton switches the interpreter on
    and rebuilds Triton's library functions for it, and a kernel that uses them (tl.cumsum) gives the float64
    reference's numbers."""
    run = _python("""
        import triton
        assert not triton.knobs.runtime.interpret
        import torch
        import gla_ref.triton
        from gla_ref import testing, torch_ref
        assert triton.knobs.runtime.interpret
        q, k, v = (torch.randn(1, 40, 2, 16) for _ in range(3))
        g = torch.nn.functional.logsigmoid(torch.randn(1, 40, 2, 16)) / 16
        o, _ = gla_ref.triton.chunk_gla(q, k, v, g)
        o64, _ = torch_ref.recurrent_gla(q.double(), k.double(), v.double(), g.double())
        print(testing.rel_rmse(o64, o))
    """)
    assert run.returncode == 0, run.stderr[-2000:]
    assert float(run.stdout.split()[-1]) < 1e-5


def test_importing_triton_first_without_knobs_is_refused_with_the_remedy():
    run = _python("""
        import triton
        del triton.knobs  # a Triton before 3.4 cannot switch its interpreter on after its import
        import gla_ref.triton
    """)
    assert run.returncode != 0
    assert "ImportError" in run.stderr and "import gla_ref.triton first" in run.stderr
