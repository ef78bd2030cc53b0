# The porter's template (examples/mlp.c) trains in-tree, in each precision. Bar: mean
# cross-entropy below 0.1 after 200 full-batch AdamW steps. Chance is ln 3 = 1.099; the best
# linear softmax classifier on these spirals stays at 1.018 (34% accuracy; plain gradient
# descent to convergence, 3000 steps), because each arm winds once around the origin. The
# MLP reaches 0.018-0.019 on the CPU in fp32, bf16 and fp16 (the loss scaler active), so 0.1
# leaves a 5x margin and cannot be met without the hidden layers learning.
if(TARGET mlp)
  foreach(prec fp32 bf16 fp16)
    add_test(NAME example_mlp_${prec}
             COMMAND mlp --steps 200 --precision ${prec} --expect-loss 0.1)
    set_tests_properties(example_mlp_${prec} PROPERTIES LABELS cpu TIMEOUT ${NT_TEST_TIMEOUT})
  endforeach()
endif()
