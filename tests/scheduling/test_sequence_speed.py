"""Issue 15: Pulser validates submitted sequences with its compiled (fastjsonschema) validator."""


def test_pulser_uses_the_compiled_schema_validator():
    from pulser.json.abstract_repr import validation

    assert validation.fastjsonschema is not None, "fastjsonschema (requirements.txt) is not installed"
    assert "sequence" in validation._FAST_VALIDATORS
