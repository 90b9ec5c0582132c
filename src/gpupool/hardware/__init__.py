"""Layer 1: GPU facts, slice and inventory types, partition planning. Standard library only.

Module map (public entry points other layers import):
- ``units``, ``slices``, ``inventory``: ``Resources``, ``Slice``/``SliceKind``, ``Inventory``.
- ``catalogue``: ``gpu_model(name)``, ``model_from_nvml_name(name, total_mib=)``, ``GPU_MODELS``.
- ``mig``: ``mig_profiles(model)``, ``mig_profile(model, name)``, ``layout_problems`` /
  ``validate_layout`` / ``is_legal_layout``, ``find_placement``, ``best_layout``, ``maximal_layouts``.
- ``capability``: ``choose_mode(model, wants_hard_isolation=)``, ``GpuMode``.
- ``models`` / ``memory``: ``model_arch(name)``, ``load_hf_config(path)``,
  ``estimate(model, quant=, max_context=, concurrency=)``,
  ``kv_bytes_per_token(layers, kv_heads, head_dim, dtype_bytes=)``, ``kv_tokens_that_fit``.
- ``spec``: ``load_cluster_spec(dict, source=)``, ``load_workload_spec(dict, source=, base_dir=)``.
- ``planner``: ``plan(cluster, workloads)``, ``inventory_from_plan(plan)``,
  ``inventory_from_cluster(cluster)``, ``PlanError``; values in ``plantypes`` (``Plan``, ``plan_to_dict``).
- ``migparted``: ``to_mig_parted(plan)``, ``parse_mig_parted(doc)``; ``mps``: ``mps_commands(plan)``.
- ``devices``: ``DeviceSource`` protocol, readings (``DeviceSnapshot``, ``GpuReading``, ...),
  ``inventory_from_snapshot``, ``reconcile_inventory``. Implementations: ``gpupool.adapters.nvml``,
  ``gpupool.adapters.simulated``.
"""
