"""``import flowrl.policies`` must not import diffusers/transformers/peft; the registry resolves lazily."""
import subprocess
import sys


def test_import_is_lazy():
    code = ("import sys, flowrl.policies as p; "
            "bad = [m for m in ('diffusers', 'transformers', 'peft') if m in sys.modules]; "
            "assert not bad, bad; assert {'sd3', 'flux', 'wan', 'toy'} <= set(p.POLICIES.names())")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_registry_resolves_sd3():
    from flowrl.policies import POLICIES
    from flowrl.policies.sd3 import SD3Policy

    assert POLICIES.get("sd3") is SD3Policy
