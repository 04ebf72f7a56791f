"""Scale-out on Ray: rollout workers (rollouts.py), the environment pool
(env_pool.py) and the learner (learner.py) as Ray actors. A one-process run never
imports this package."""
