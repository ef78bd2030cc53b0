# The nanotrain program under mpirun (label cpu; tests/dist_nanotrain.sh runs each case):
# GPT and CNN at N = 1-4 ranks under every strategy against one process training the same
# global batch (losses and final checkpoint, fp32, rtol 1e-5), a resume that reshards
# 4 -> 2 -> 1 -> 3 ranks, a rank killed mid-run, ranks with different configurations.
# Skipped (77) without mpirun or numpy.
if(TARGET nanotrain AND MPI_C_FOUND AND MPIEXEC_EXECUTABLE)
  set(nt_dn ${CMAKE_CURRENT_SOURCE_DIR}/dist_nanotrain.sh)
  set(nt_dn_work ${CMAKE_CURRENT_BINARY_DIR}/dist_nanotrain)
  function(nt_dn_test name)
    add_test(NAME ${name} COMMAND bash ${nt_dn} ${ARGN})
    set_tests_properties(${name} PROPERTIES LABELS cpu SKIP_RETURN_CODE 77 TIMEOUT 180)
    if(NT_SANITIZE)   # OpenMPI's own allocations are never freed
      set_tests_properties(${name} PROPERTIES ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
    endif()
  endfunction()
  set(nt_dn_args $<TARGET_FILE:nanotrain> ${MPIEXEC_EXECUTABLE} ${nt_dn_work})
  foreach(model gpt cnn)
    foreach(np 1 2 3 4)
      nt_dn_test(dist_nt_ref_${model}_${np} ref ${nt_dn_args} ${model} ${np})
      set_tests_properties(dist_nt_ref_${model}_${np} PROPERTIES
                           FIXTURES_SETUP dist_nt_ref_${model}_${np})
      foreach(s NO_SHARD SHARD_GRAD_OP FULL_SHARD)
        nt_dn_test(dist_nt_${model}_${s}_${np} compare ${nt_dn_args} ${model} ${np} ${s})
        set_tests_properties(dist_nt_${model}_${s}_${np} PROPERTIES
                             FIXTURES_REQUIRED dist_nt_ref_${model}_${np})
      endforeach()
    endforeach()
  endforeach()
  # Gradient accumulation: 2 ranks x 2 micro-steps against one process with batch 16.
  foreach(model gpt cnn)
    foreach(s NO_SHARD FULL_SHARD)
      nt_dn_test(dist_nt_${model}_${s}_2_accum2 compare ${nt_dn_args} ${model} 2 ${s} 2)
      set_tests_properties(dist_nt_${model}_${s}_2_accum2 PROPERTIES
                           FIXTURES_REQUIRED dist_nt_ref_${model}_4)
    endforeach()
  endforeach()
  # Resharded resume through consolidated checkpoints (--checkpoint-format consolidated): 4 -> 2
  # -> 1 -> 3 ranks, 5 steps each,
  # global batch 12, against one process with batch 12 (dist_nt_ref_gpt_3).
  set(stages "4 FULL_SHARD 5" "2 SHARD_GRAD_OP 10" "1 NO_SHARD 15" "3 FULL_SHARD 20")
  set(k 0)
  foreach(stage ${stages})
    math(EXPR k "${k} + 1")
    separate_arguments(stage)
    set(extra)
    if(k EQUAL 4)
      set(extra last)
    endif()
    nt_dn_test(dist_nt_resume_${k} resume ${nt_dn_args} ${k} ${stage} ${extra})
    set(req dist_nt_ref_gpt_3)
    if(k GREATER 1)
      math(EXPR prev "${k} - 1")
      list(APPEND req dist_nt_resume_${prev}_done)
    endif()
    set_tests_properties(dist_nt_resume_${k} PROPERTIES FIXTURES_REQUIRED "${req}"
                         FIXTURES_SETUP dist_nt_resume_${k}_done)
  endforeach()
  # Sharded checkpoints: saved by 4 ranks (FULL_SHARD), resumed at 1, 2 and 3 ranks under each
  # strategy (resharded: each rank reads the ranges it now owns) and saved sharded again,
  # against one process (losses, and the final shards consolidated by numpy); the
  # consolidated and the sharded save of the same state resume bit-identically; a changed or
  # missing shard file is refused.
  nt_dn_test(dist_nt_sharded_save sharded_save ${nt_dn_args})
  set_tests_properties(dist_nt_sharded_save PROPERTIES FIXTURES_SETUP dist_nt_sharded)
  foreach(stage "1 NO_SHARD" "2 NO_SHARD" "2 SHARD_GRAD_OP" "3 FULL_SHARD")
    separate_arguments(stage)
    list(GET stage 0 np)
    list(GET stage 1 s)
    nt_dn_test(dist_nt_sharded_resume_4_to_${np}_${s} sharded_resume ${nt_dn_args} ${stage})
    set_tests_properties(dist_nt_sharded_resume_4_to_${np}_${s} PROPERTIES
                         FIXTURES_REQUIRED "dist_nt_sharded;dist_nt_ref_gpt_3")
  endforeach()
  nt_dn_test(dist_nt_sharded_same sharded_same ${nt_dn_args})
  nt_dn_test(dist_nt_sharded_bad sharded_bad ${nt_dn_args})
  set_tests_properties(dist_nt_sharded_same dist_nt_sharded_bad PROPERTIES
                       FIXTURES_REQUIRED dist_nt_sharded TIMEOUT 90)
  # The CNN resumed mid-epoch at another world size (the position is kept in samples).
  nt_dn_test(dist_nt_cnn_resume_2_to_1 cnn_resume ${nt_dn_args})
  set_tests_properties(dist_nt_cnn_resume_2_to_1 PROPERTIES FIXTURES_REQUIRED dist_nt_ref_cnn_2)
  # SIGTERM to one rank: every rank stops after the same step, saves it and exits 143.
  nt_dn_test(dist_nt_stop_one_rank_3 stop ${nt_dn_args} 3)
  nt_dn_test(dist_nt_stop_one_rank_2_log3 stop ${nt_dn_args} 2 3)
  set_tests_properties(dist_nt_stop_one_rank_3 dist_nt_stop_one_rank_2_log3 PROPERTIES
                       TIMEOUT 90 RESOURCE_LOCK dist_nt_stop)
  # GPU (label gpu): the FSDP step captured as a CUDA graph at world 1 (NCCL, and the LOCAL
  # backend) against the same run eager.
  foreach(s NO_SHARD SHARD_GRAD_OP FULL_SHARD)
    foreach(b nccl local)
      nt_dn_test(dist_gpu_graph_${s}_${b} graph ${nt_dn_args} ${s} ${b})
      set_tests_properties(dist_gpu_graph_${s}_${b} PROPERTIES LABELS gpu)
    endforeach()
  endforeach()
  nt_dn_test(dist_nt_killed_rank killed ${nt_dn_args} 3)
  set_tests_properties(dist_nt_killed_rank PROPERTIES TIMEOUT 60)
  nt_dn_test(dist_nt_config_mismatch mismatch ${nt_dn_args})
  set_tests_properties(dist_nt_config_mismatch PROPERTIES TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "configurations differ: rank 0 has hash [0-9a-f]+, rank 1")
endif()
