/* The CNN training loop: Fashion-MNIST through data/'s loader (shuffled per epoch, normalised
 * with mean 0.2860 / std 0.3530, optional crop + flip), test accuracy after every epoch. */
#include "train/train_internal.h"
#include "data/datasets.h"
#include "data/idx.h"
#include "data/loader.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FASHION_MEAN 0.2860f
#define FASHION_STD 0.3530f

typedef struct {
  nt_cnn *m;
  nt_trainer *T;
  nt_tensor x, y;                   /* fixed device input [B, C, H, W] (compute dtype), [B] */
} cnn_run;

static nt_status body(nt_ctx *ctx, void *arg) {
  cnn_run *r = arg;
  nt_status st = nt_params_zero_grad(ctx, nt_cnn_params(r->m));
  if (!st) st = nt_cnn_train_step(ctx, r->m, &r->x, &r->y, nt_trainer_loss_scale(r->T));
  return st;
}

/* Moves a loader batch into the model's fixed input buffers (converting the images). */
static nt_status stage_batch(nt_ctx *ctx, cnn_run *r, const nt_batch *b, nt_tensor *x,
                             nt_tensor *y) {
  const nt_tensor *img = &b->field[0], *lab = &b->field[1];
  int64_t n = b->size;
  int64_t xs[4] = {n, r->x.shape[1], r->x.shape[2], r->x.shape[3]};
  *x = nt_prefix_view(&r->x, 4, xs);
  *y = nt_prefix_view(&r->y, 1, &n);
  nt_tensor src = nt_tensor_view(img->data, img->dtype, img->device, 4, xs);
  nt_status st = src.dtype == x->dtype ? nt_tensor_copy(ctx, x, &src) : nt_convert(ctx, x, &src);
  nt_tensor ls = nt_tensor_view(lab->data, NT_I32, lab->device, 1, &n);
  if (!st) st = nt_tensor_copy(ctx, y, &ls);
  return st;
}

static nt_status evaluate(nt_trainer *T, cnn_run *r, nt_loader *test, double *loss,
                          double *acc) {
  nt_ctx *ctx = T->ctx;
  const nt_cnn_config *c = nt_cnn_get_config(r->m);
  int64_t B = r->x.shape[0], correct = 0, seen = 0;
  double lsum = 0;
  size_t es = nt_dtype_size(r->x.dtype);
  void *hl = malloc((size_t)(B * c->classes) * es);
  int32_t *hy = malloc((size_t)B * sizeof *hy);
  nt_status st = hl && hy ? nt_loader_set_epoch(test, 0)
                          : NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for evaluation");
  for (;;) {
    nt_batch b;
    bool end = false;
    if (!st) st = nt_loader_next(test, &b, &end);
    if (st || end) break;
    nt_tensor x, y, logits;
    float l;
    st = stage_batch(ctx, r, &b, &x, &y);
    if (!st) st = nt_cnn_eval(ctx, r->m, &x, &y, &logits);
    if (!st) st = nt_trainer_read_scalar(T, nt_cnn_loss(r->m), &l);
    nt_tensor hlv = nt_tensor_view(hl, logits.dtype, nt_cpu(), 2, logits.shape);
    nt_tensor hyv = nt_tensor_view(hy, NT_I32, nt_cpu(), 1, y.shape);
    if (!st) st = nt_tensor_copy(ctx, &hlv, &logits);
    if (!st) st = nt_tensor_copy(ctx, &hyv, &y);
    if (st) break;
    for (int64_t i = 0; i < b.size; i++) {
      int best = 0;
      float bv = -INFINITY;
      for (int k = 0; k < c->classes; k++) {
        float v = nt_load_f32(hl, logits.dtype, i * c->classes + k);
        if (v > bv) {
          bv = v;
          best = k;
        }
      }
      correct += best == hy[i];
    }
    lsum += (double)l * (double)b.size;
    seen += b.size;
  }
  free(hl);
  free(hy);
  if (!st) {
    *loss = seen ? lsum / (double)seen : NAN;
    *acc = seen ? (double)correct / (double)seen : NAN;
  }
  return st;
}

static void write_config(nt_jw *w, const void *arg) {
  const nt_cnn_config *c = arg;
  nt_jw_key(w, "in_channels");
  nt_jw_i64(w, c->in_channels);
  nt_jw_key(w, "height");
  nt_jw_i64(w, c->height);
  nt_jw_key(w, "width");
  nt_jw_i64(w, c->width);
  nt_jw_key(w, "c1");
  nt_jw_i64(w, c->c1);
  nt_jw_key(w, "c2");
  nt_jw_i64(w, c->c2);
  nt_jw_key(w, "hidden");
  nt_jw_i64(w, c->hidden);
  nt_jw_key(w, "classes");
  nt_jw_i64(w, c->classes);
  nt_jw_key(w, "dropout");
  nt_jw_num(w, c->dropout);
  nt_jw_key(w, "mean");
  nt_jw_num(w, FASHION_MEAN);
  nt_jw_key(w, "std");
  nt_jw_num(w, FASHION_STD);
}

/* The test set's loss and accuracy into the log and the result, then a checkpoint. */
static nt_status evaluate_and_save(nt_trainer *T, cnn_run *r, nt_loader *test,
                                   const nt_cnn_config *cfg) {
  double tl, acc;
  nt_status st = evaluate(T, r, test, &tl, &acc);
  if (!st) st = nt_trainer_log_eval(T, NAN, tl, acc);
  T->res->test_loss = tl;
  T->res->test_accuracy = acc;
  if (!st) st = nt_trainer_save(T, write_config, cfg);
  return st;
}

nt_status nt_train_cnn(nt_ctx *ctx, const nt_train_options *o, const nt_policy *pol,
                       nt_train_result *res) {
  nt_cnn_config cfg = o->cnn;
  cnn_run r;
  nt_trainer T;
  nt_json side;
  nt_image_set train_set, test_set;
  nt_loader *train = NULL, *test = NULL;
  memset(&r, 0, sizeof r);
  memset(&T, 0, sizeof T);
  memset(&side, 0, sizeof side);
  memset(&train_set, 0, sizeof train_set);
  memset(&test_set, 0, sizeof test_set);
  nt_status st = NT_OK;
  if (o->resume) {
    st = nt_trainer_read_sidecar(ctx, o->resume, &side);
    const nt_json *c = nt_json_get(&side, "config");
    if (!st && c) {
      cfg.c1 = (int)nt_json_get_i64(c, "c1", cfg.c1);
      cfg.c2 = (int)nt_json_get_i64(c, "c2", cfg.c2);
      cfg.hidden = (int)nt_json_get_i64(c, "hidden", cfg.hidden);
    }
  }
  if (!st) st = nt_fashion_mnist_load(ctx, o->data_dir, true, &train_set);
  if (!st) st = nt_fashion_mnist_load(ctx, o->data_dir, false, &test_set);
  if (st) goto done;
  int64_t full_train = train_set.n, full_test = test_set.n;
  if (o->train_subset > 0 && o->train_subset < train_set.n) train_set.n = o->train_subset;
  if (o->test_subset > 0 && o->test_subset < test_set.n) test_set.n = o->test_subset;
  cfg.height = (int)train_set.h;
  cfg.width = (int)train_set.w;
  cfg.in_channels = 1;
  cfg.classes = train_set.num_classes;
  nt_image_source tr_src = {&train_set, false, {o->augment ? 2 : 0, o->augment, FASHION_MEAN,
                                                FASHION_STD}};
  nt_image_source te_src = {&test_set, false, {0, false, FASHION_MEAN, FASHION_STD}};
  nt_dataset tr_ds = nt_image_dataset(&tr_src), te_ds = nt_image_dataset(&te_src);
  int64_t B = o->batch_size;
  nt_loader_opts lo = nt_loader_default_opts();
  lo.batch_size = B;
  lo.shuffle = true;
  lo.seed = o->seed;
  lo.drop_last = true;           /* fixed shapes: one CUDA graph for every step */
  lo.num_workers = o->num_workers;
  st = nt_loader_create(ctx, &tr_ds, &lo, &train);
  lo.shuffle = false;
  lo.drop_last = false;
  if (!st) st = nt_loader_create(ctx, &te_ds, &lo, &test);
  nt_dtype dt = pol->compute_dtype;
  if (!st) st = nt_cnn_create(ctx, &cfg, dt, (int)B, &r.m);
  if (!st) st = nt_params_init(ctx, nt_cnn_params(r.m), o->seed);
  if (!st && pol->fp8) st = nt_cnn_enable_fp8(ctx, r.m, false);
  int64_t xs[4] = {B, cfg.in_channels, cfg.height, cfg.width};
  if (!st) st = nt_tensor_alloc(ctx, &r.x, dt, 4, xs);
  if (!st) st = nt_tensor_alloc(ctx, &r.y, NT_I32, 1, &B);
  nt_ctx_manual_seed(ctx, o->seed + 2);
  nt_ctx_set_rng_offset(ctx, 0);
  if (!st) st = nt_trainer_init(&T, ctx, o, res, nt_cnn_params(r.m), "cnn", "images");
  if (st) goto done;
  r.T = &T;
  T.body = body;
  T.body_arg = &r;
  int64_t nb = nt_loader_num_batches(train);
  T.total_iters = T.schedule_iters = nb * o->epochs;   /* --max-iters stops, not reshapes */
  if (o->max_iters > 0 && o->max_iters < T.total_iters) T.total_iters = o->max_iters;
  T.items_per_step = B;
  T.flops_per_item = nt_cnn_flops_per_image(r.m);
  if (o->resume) st = nt_trainer_restore(&T, &side);
  nt_model_sizes sizes;
  nt_mem_estimate est;
  memset(&est, 0, sizeof est);
  if (!st) st = nt_cnn_estimate(ctx, &cfg, dt, (int)B, &sizes);
  if (!st)
    nt_memest_compute(&sizes, dt, B, (int64_t)cfg.in_channels * cfg.height * cfg.width,
                      cfg.classes, NT_SHARD_NO_SHARD, 1,
                      nt_ctx_is_cuda(ctx) ? NT_MEMEST_WORKSPACE_BYTES : 0, &est);
  if (!st)
    nt_trainer_print(&T, "cnn: widths %d/%d, hidden %d, %.2fM parameters, %s on %s, batch %lld, "
                     "%lld/%lld train/test images, %d epochs (%lld steps)\n",
                     cfg.c1, cfg.c2, cfg.hidden, (double)nt_cnn_params(r.m)->n_real / 1e6,
                     nt_precision_name(pol->precision), nt_ctx_is_cuda(ctx) ? "cuda" : "cpu",
                     (long long)B, (long long)train_set.n, (long long)test_set.n, o->epochs,
                     (long long)T.total_iters);
  while (!st && T.iter < T.total_iters) {
    st = nt_loader_set_epoch(train, T.epoch);
    for (int64_t k = 0; !st && k < T.batch_in_epoch; k++) {   /* resume mid-epoch */
      nt_batch b;
      bool end;
      st = nt_loader_next(train, &b, &end);
    }
    nt_loader_reset_stats(train);
    uint64_t waited = 0;
    while (!st && T.iter < T.total_iters) {
      nt_batch b;
      bool end = false;
      nt_tensor x, y;
      st = nt_loader_next(train, &b, &end);
      if (st || end) break;
      nt_loader_stats ls;
      nt_loader_get_stats(train, &ls);
      T.wait_s += 1e-9 * (double)(ls.wait_ns_total - waited);
      waited = ls.wait_ns_total;
      st = stage_batch(ctx, &r, &b, &x, &y);
      T.batch_in_epoch++;
      if (!st) st = nt_trainer_step(&T, nt_cnn_loss(r.m));
    }
    if (st) break;
    if (T.batch_in_epoch >= nb) {
      T.epoch++;
      T.batch_in_epoch = 0;
      st = evaluate_and_save(&T, &r, test, &cfg);
      T.t_last = nt_now_s();
    }
  }
  if (!st && (T.batch_in_epoch != 0 || isnan(res->test_accuracy)))   /* stopped mid-epoch */
    st = evaluate_and_save(&T, &r, test, &cfg);
  if (!st) nt_trainer_finish(&T, &est);
  train_set.n = full_train;
  test_set.n = full_test;
done:
  nt_trainer_free(&T);
  nt_loader_free(train);
  nt_loader_free(test);
  nt_json_free(&side);
  nt_tensor_free(ctx, &r.x);
  nt_tensor_free(ctx, &r.y);
  nt_cnn_free(ctx, r.m);
  nt_image_set_free(&train_set);
  nt_image_set_free(&test_set);
  return st;
}
