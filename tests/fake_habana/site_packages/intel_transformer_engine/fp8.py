"""Fake intel_transformer_engine.fp8: FP8GlobalStateManager tells whether an fp8_autocast region is active."""


class FP8GlobalStateManager:
    _enabled = False
    _recipe = None

    @classmethod
    def is_fp8_enabled(cls):
        return cls._enabled

    @classmethod
    def get_fp8_recipe(cls):
        return cls._recipe

    @classmethod
    def _enter(cls, enabled, recipe):
        previous = (cls._enabled, cls._recipe)
        cls._enabled, cls._recipe = bool(enabled), recipe
        return previous

    @classmethod
    def _exit(cls, previous):
        cls._enabled, cls._recipe = previous
