"""The lazy registry: names, import strings, file paths, decorators, and did-you-mean errors."""
import sys

import pytest

from flowrl.registry import Registry, RegistryError, import_string


def test_lazy_name_resolves_on_first_use():
    reg = Registry("thing", {"dumps": "json:dumps"})
    assert reg.get("dumps")({"a": 1}) == '{"a": 1}'


def test_import_string_and_file_path(tmp_path):
    f = tmp_path / "plug.py"
    f.write_text("def score(x):\n    return x + 1\n")
    reg = Registry("thing")
    assert reg.get(f"{f}:score")(1) == 2
    assert import_string("os.path:join")("a", "b") == "a/b"


def test_decorator_and_object_registration():
    reg = Registry("thing")

    @reg.register("double")
    def double(x):
        return 2 * x

    reg.register("triple", lambda x: 3 * x)
    assert reg.get("double")(2) == 4 and reg.get("triple")(2) == 6
    assert reg.names() == ["double", "triple"]


def test_unknown_name_suggests_nearest():
    reg = Registry("reward", {"pickscore": "json:dumps", "clipscore": "json:loads"})
    with pytest.raises(RegistryError, match=r"unknown reward 'pikscore'; did you mean 'pickscore'\?"):
        reg.get("pikscore")


def test_bad_attribute_and_missing_module_and_file():
    with pytest.raises(RegistryError, match="did you mean 'dumps'"):
        import_string("json:dumpss")
    with pytest.raises(RegistryError, match="cannot import"):
        import_string("no_such_module_xyz:thing")
    with pytest.raises(RegistryError, match="plugin file not found"):
        import_string("/nonexistent/plug.py:f")


def test_lazy_registry_does_not_import_target():
    reg = Registry("thing", {"x": "xml.dom.minidom:parseString"})
    sys.modules.pop("xml.dom.minidom", None)
    assert "x" in reg
    assert "xml.dom.minidom" not in sys.modules
