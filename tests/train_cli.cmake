# Command-line checks of the training program and the memory estimator: --help succeeds, bad
# options fail with exit status 2 and a message naming the option, a second run on a locked
# out-dir fails at once, SIGTERM ends a run with 143, a tiny CPU run and a resume from its
# checkpoint succeed (random tokens). Every check looks at the exit status (tests/cli/expect.cmake).
function(nt_cli_test name code regex)
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} "-DCMD=${ARGN}" -DEXIT=${code}
           "-DREGEX=${regex}" -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.cmake)
  set_tests_properties(${name} PROPERTIES LABELS cpu)
endfunction()
if(TARGET nanotrain)
  set(nt $<TARGET_FILE:nanotrain>)
  nt_cli_test(train_cli_help 0 "usage: nanotrain" ${nt} --help)
  nt_cli_test(train_cli_bad_option 2 "unknown option '--no-such-option'" ${nt} --no-such-option)
  nt_cli_test(train_cli_bad_value 2 "invalid value 'zero' for --batch-size" ${nt} cnn
              --batch-size zero)
  nt_cli_test(train_cli_bad_dtype 2 "invalid value 'fp12' for --dtype" ${nt} gpt --dtype fp12)
  nt_cli_test(train_cli_missing_value 2 "--lr needs a value" ${nt} gpt --lr)
  nt_cli_test(train_cli_layer_wrap 2 "'4294967298' for --n-layer: must be an integer in .1, 1024."
              ${nt} gpt --n-layer 4294967298)
  nt_cli_test(train_cli_layer_huge 2 "'200000' for --n-layer" ${nt} gpt --n-layer 200000)
  nt_cli_test(train_cli_negative 2 "'-5' for --max-iters" ${nt} gpt --max-iters -5)
  nt_cli_test(train_cli_beta_range 2 "'1.5' for --beta2: must be in .0, 1." ${nt} gpt
              --beta2 1.5)
  nt_cli_test(train_cli_heads_divide 2 "'5' for --n-head: must divide --n-embd" ${nt} gpt
              --n-head 5)
  nt_cli_test(train_cli_widths 2 "for --widths" ${nt} cnn --widths 99999999999,1,1)
  # a block longer than the validation split fails before the model is built
  nt_cli_test(train_cli_block_split 2
              "--block-size 1000000 needs 1000001 tokens per sample but the validation split"
              ${nt} gpt --device cpu --data synthetic --vocab-size 50 --n-layer 1 --n-head 2
              --n-embd 32 --block-size 1000000 --batch-size 1 --max-iters 1)
  set_tests_properties(train_cli_block_split PROPERTIES TIMEOUT 30)
  # memest's estimate over free memory: refused before training (tests/cli/preflight.sh)
  add_test(NAME train_cli_preflight_memory COMMAND bash
           ${CMAKE_CURRENT_SOURCE_DIR}/cli/preflight.sh ${nt} cpu)
  set_tests_properties(train_cli_preflight_memory PROPERTIES LABELS cpu TIMEOUT 60)
  add_test(NAME gpu_train_cli_preflight_memory COMMAND bash
           ${CMAKE_CURRENT_SOURCE_DIR}/cli/preflight.sh ${nt} cuda)
  set_tests_properties(gpu_train_cli_preflight_memory PROPERTIES LABELS gpu TIMEOUT 60
                       SKIP_RETURN_CODE 77)
  nt_cli_test(train_cli_extra_arg 2 "unexpected argument 'extra'" ${nt} gpt extra)
  set(tiny_base --device cpu --data synthetic --vocab-size 50 --n-layer 1 --n-head 2 --n-embd 32
      --block-size 16 --batch-size 4 --eval-interval 5 --eval-iters 2 --log-interval 5
      --sample 20)
  set(tiny ${tiny_base} --out-dir ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run)
  add_test(NAME train_cli_clean COMMAND ${CMAKE_COMMAND} -E rm -rf
           ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run)
  nt_cli_test(train_cli_tiny_run 0 "done: 10 steps" ${nt} gpt ${tiny} --max-iters 10)
  set_tests_properties(train_cli_clean PROPERTIES LABELS cpu FIXTURES_SETUP cli_run)
  set_tests_properties(train_cli_tiny_run PROPERTIES FIXTURES_REQUIRED cli_run)
  nt_cli_test(train_cli_tiny_resume 0 "resumed from .* at step 10.*done: 15 steps" ${nt} gpt
              ${tiny} --max-iters 15 --resume ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run)
  set_tests_properties(train_cli_tiny_resume PROPERTIES DEPENDS train_cli_tiny_run)
  # a shape or hyperparameter given on resume (these take the out-dir's lock: RESOURCE_LOCK
  # keeps them apart from train_cli_locked, which holds it) that differs from the checkpoint's is an error
  # naming both values (exit 2); documented overrides (--max-iters above) are not
  nt_cli_test(train_cli_resume_conflict 2
              "--n-layer 2 .the checkpoint has 1., --n-head 1 .the checkpoint has 2."
              ${nt} gpt ${tiny} --n-layer 2 --n-head 1 --max-iters 30 --resume
              ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run)
  set_tests_properties(train_cli_resume_conflict PROPERTIES DEPENDS train_cli_tiny_resume
                       RESOURCE_LOCK train_cli_run)
  nt_cli_test(train_cli_resume_dtype 2 "--dtype bf16 .the checkpoint has fp32." ${nt} gpt
              ${tiny} --dtype bf16 --max-iters 30 --resume ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run)
  set_tests_properties(train_cli_resume_dtype PROPERTIES DEPENDS train_cli_tiny_resume
                       RESOURCE_LOCK train_cli_run)
  nt_cli_test(train_cli_resume_lr 2 "--batch-size 8 .the checkpoint has 4., --lr 0.002 .the "
              ${nt} gpt ${tiny} --batch-size 8 --lr 0.002 --max-iters 30 --resume
              ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run)
  set_tests_properties(train_cli_resume_lr PROPERTIES DEPENDS train_cli_tiny_resume
                       RESOURCE_LOCK train_cli_run)
  # --resume given one checkpoint directory: the run goes on in its out-dir (not inside it)
  nt_cli_test(train_cli_resume_dir 0 "resumed from .*ckpt-15 at step 15.*done: 20 steps" ${nt}
              gpt ${tiny_base} --max-iters 20 --resume
              ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run/ckpt-15)
  add_test(NAME train_cli_resume_dir_layout COMMAND ${CMAKE_COMMAND} -E cat
           ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run/ckpt-20/MANIFEST.json)
  set_tests_properties(train_cli_resume_dir PROPERTIES DEPENDS train_cli_tiny_resume)
  set_tests_properties(train_cli_resume_dir_layout PROPERTIES LABELS cpu
                       DEPENDS train_cli_resume_dir)
  # a run holding the out-dir's lock (here flock(1), the same lock) stops a second one at once
  find_program(NT_FLOCK flock)
  if(NT_FLOCK)
    nt_cli_test(train_cli_locked 1 "out-dir .* is in use by another nanotrain run" ${NT_FLOCK}
                -n ${CMAKE_CURRENT_BINARY_DIR}/train_cli_run/.lock ${nt} gpt ${tiny}
                --max-iters 20)
    set_tests_properties(train_cli_locked PROPERTIES DEPENDS train_cli_tiny_resume
                         RESOURCE_LOCK train_cli_run)
  endif()
  # SIGTERM: exit status 143 (tests/cli/sigterm.sh)
  add_test(NAME train_cli_sigterm COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/sigterm.sh ${nt}
           ${CMAKE_CURRENT_BINARY_DIR}/train_cli_sigterm)
  set_tests_properties(train_cli_sigterm PROPERTIES LABELS cpu)
  # The vocabulary in the checkpoint: another text refused, sampling writes nothing
  add_test(NAME train_cli_vocab COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/vocab.sh ${nt}
           ${CMAKE_CURRENT_BINARY_DIR}/train_cli_vocab)
  set_tests_properties(train_cli_vocab PROPERTIES LABELS cpu)
  # docs/resume.md's table: every option has a rule on resume, and each row behaves as written
  # (tests/cli/resume_table.sh; its data are made by the script)
  foreach(m gpt cnn)
    set(tname train_cli_resume_table)
    if(m STREQUAL "cnn")
      set(tname train_cli_resume_table_cnn)
    endif()
    add_test(NAME ${tname} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/resume_table.sh ${nt}
             ${CMAKE_SOURCE_DIR}/docs/resume.md ${CMAKE_SOURCE_DIR}/examples/nanotrain.c
             ${CMAKE_CURRENT_BINARY_DIR}/${tname} ${m})
    set_tests_properties(${tname} PROPERTIES LABELS cpu)
  endforeach()
  # A failed checkpoint write warns, training goes on and saves later (tests/cli/save_fail.sh)
  add_test(NAME train_cli_save_fail COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/save_fail.sh ${nt}
           ${CMAKE_CURRENT_BINARY_DIR}/train_cli_save_fail)
  set_tests_properties(train_cli_save_fail PROPERTIES LABELS cpu)
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
  set(me $<TARGET_FILE:memest>)
  nt_cli_test(memest_gpt2_full_shard 0 "parameters .count. +124475904" ${me} --preset gpt2
              --batch-size 16 --sharding FULL_SHARD --world-size 8)
  nt_cli_test(memest_bad_sharding 2 "invalid value 'ZERO9' for --sharding" ${me} --sharding ZERO9)
  nt_cli_test(memest_layer_wrap 2 "'4294967298' for --n-layer" ${me} --n-layer 4294967298)
  nt_cli_test(memest_layer_huge 2 "'200000' for --n-layer" ${me} --n-layer 200000)
  nt_cli_test(memest_missing_value 2 "--batch-size needs a value" ${me} --batch-size)
  nt_cli_test(memest_bad_world 2 "'0' for --world-size" ${me} --world-size 0)
  nt_cli_test(memest_help 0 "usage: memest" ${me} --help)
endif()
