# Command-line checks of the training program and the memory estimator: --help succeeds, bad
# options fail with exit status 2 and a message, a tiny CPU run and a resume from its
# checkpoint succeed (tiny shakespeare when NT_DATA_DIR has it; random tokens otherwise).
if(TARGET nanotrain)
  add_test(NAME train_cli_help COMMAND nanotrain --help)
  add_test(NAME train_cli_bad_option COMMAND nanotrain --no-such-option)
  add_test(NAME train_cli_bad_value COMMAND nanotrain cnn --batch-size zero)
  add_test(NAME train_cli_bad_dtype COMMAND nanotrain gpt --dtype fp12)
  set_tests_properties(train_cli_bad_option PROPERTIES PASS_REGULAR_EXPRESSION "unknown option")
  set_tests_properties(train_cli_bad_value PROPERTIES PASS_REGULAR_EXPRESSION "invalid value 'zero' for --batch-size")
  set_tests_properties(train_cli_bad_dtype PROPERTIES PASS_REGULAR_EXPRESSION "invalid value 'fp12' for --dtype")
  set(tiny --device cpu --data synthetic --vocab-size 50 --n-layer 1 --n-head 2 --n-embd 32
      --block-size 16 --batch-size 4 --eval-interval 5 --eval-iters 2 --log-interval 5
      --sample 20 --out-dir ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run)
  add_test(NAME train_cli_tiny_run COMMAND nanotrain gpt ${tiny} --max-iters 10)
  add_test(NAME train_cli_tiny_resume COMMAND nanotrain gpt ${tiny} --max-iters 15
           --resume ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run)
  set_tests_properties(train_cli_tiny_run PROPERTIES LABELS cpu PASS_REGULAR_EXPRESSION "done: 10 steps")
  set_tests_properties(train_cli_tiny_resume PROPERTIES LABELS cpu DEPENDS train_cli_tiny_run
                       PASS_REGULAR_EXPRESSION "resumed from .* at step 10.*done: 15 steps")
  set_tests_properties(train_cli_help train_cli_bad_option train_cli_bad_value train_cli_bad_dtype
                       PROPERTIES LABELS cpu)
  # The checkpoint read back as a numpy / PyTorch user would (tests/check_safetensors.py).
  find_program(NT_PYTHON3 python3)
  if(NT_PYTHON3)
    add_test(NAME train_cli_ckpt_readable COMMAND ${NT_PYTHON3}
             ${CMAKE_SOURCE_DIR}/tests/check_safetensors.py
             ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run/ckpt-15/ckpt.safetensors
             ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run/ckpt-15/ckpt.json)
    set_tests_properties(train_cli_ckpt_readable PROPERTIES LABELS cpu SKIP_RETURN_CODE 77
                         DEPENDS train_cli_tiny_resume)
  endif()
endif()
if(TARGET memest)
  add_test(NAME memest_gpt2_full_shard COMMAND memest --preset gpt2 --batch-size 16
           --sharding FULL_SHARD --world-size 8)
  set_tests_properties(memest_gpt2_full_shard PROPERTIES LABELS cpu
                       PASS_REGULAR_EXPRESSION "parameters \\(count\\) +124475904")
  add_test(NAME memest_bad_sharding COMMAND memest --sharding ZERO9)
  set_tests_properties(memest_bad_sharding PROPERTIES LABELS cpu
                       PASS_REGULAR_EXPRESSION "invalid value 'ZERO9' for --sharding")
endif()
