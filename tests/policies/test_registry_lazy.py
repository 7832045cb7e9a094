"""``import flowrl.policies`` must not import diffusers/transformers/peft; the registry resolves lazily."""


def test_import_is_lazy(import_probe):
    """conftest.import_probe: an interpreter that imported flowrl.policies (after the rewards) holds none of the
    three, and the registry knows the families by name."""
    bad = [m for m in ('diffusers', 'transformers', 'peft') if m in import_probe["packages"]]
    assert not bad, bad
    assert {'sd3', 'flux', 'wan', 'toy'} <= set(import_probe["policies"])


def test_registry_resolves_sd3():
    from flowrl.policies import POLICIES
    from flowrl.policies.sd3 import SD3Policy

    assert POLICIES.get("sd3") is SD3Policy
