"""Small seeded example models to profile and place: Keras (:mod:`.keras_models`) and PyTorch
(:mod:`.torch_models`). They install as ``baechi.examples`` so that ``baechi profile --example``
and the tests can build them; they are examples, not part of the client API."""
