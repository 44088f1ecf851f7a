"""Framework adapters: ctrlrun enforced where an agent framework's tool call becomes an effect.

One module per framework, each an optional extra of django-ctrlrun (``pip install -e
'.[<framework>]'`` in a clone); none is imported by ``import ctrlrun``. Every adapter goes through
``ctrlrun.Control.call``/``acall`` - the same steps as a protected function - so a framework's own
approval flag never runs a tool by itself: only a grant ctrlrun holds for the exact action hash does.
"""
