"""The kernel: one protected call as a closed sequence of steps, and the two drivers that run it.

- ``context``: who acts, which approval is presented, which attempt is running (context variables,
  so they follow a call across ``await``, ``asyncio.gather`` and ``asyncio.to_thread``);
- ``steps``: the call itself (find the principal, decide, take the key, invoke, finish,
  reconcile if asked) written once as a generator that *yields* what it needs done - a store
  phase, the user's function, a reconcile hook, a pause - and does no I/O of its own;
- ``drive``: the synchronous driver (does each thing in the calling thread) and the asynchronous
  one (store phases on ctrlrun's own threads, the function and async hooks awaited, pauses with
  ``asyncio.sleep``). Nothing of the pipeline is written twice.

The pure layer below it (canonical, policy, states, errors) knows nothing of Django; neither do
``context`` and ``steps``: the store is reached through the ``Control`` that runs the call.
"""
