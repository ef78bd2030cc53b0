/* The CNN as a trained model (train/model.h): Fashion-MNIST through data/'s loader (shuffled
 * per epoch, normalised with mean 0.2860 / std 0.3530, optional crop + flip), test loss and
 * accuracy as its evaluation (the trainer runs one after every epoch). */
#include "train/model.h"
#include "models/cnn.h"
#include "data/datasets.h"
#include "data/idx.h"
#include "data/loader.h"
#include "dist/comm.h"
#include "train/preflight.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FASHION_MEAN 0.2860f
#define FASHION_STD 0.3530f

typedef struct {
  nt_model base;
  nt_cnn *m;
  nt_tensor x, y;                   /* fixed device input [B, C, H, W] (compute dtype), [B] */
  nt_image_set train_set, test_set;
  int64_t full_train, full_test;    /* the sets' sizes before a subset was taken */
  nt_image_source train_src, test_src;   /* the loaders' datasets point at these */
  nt_loader *train, *test;
  uint64_t waited_ns;               /* the train loader's wait total at the latest batch */
  nt_data_id data_id;               /* both whole sets (the checkpoint records it) */
} cnn_run;

static nt_status micro_step(nt_ctx *ctx, nt_model *md, const nt_model_batch *b,
                            const float *loss_scale, const nt_unit_hooks *hooks) {
  cnn_run *r = md->impl;
  return nt_cnn_train_step(ctx, r->m, &b->inputs, &b->targets, loss_scale, hooks);
}

static const nt_tensor *loss(const nt_model *md) {
  const cnn_run *r = md->impl;
  return nt_cnn_loss(r->m);
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

static nt_status evaluate(nt_ctx *ctx, nt_model *md, nt_eval_result *e) {
  cnn_run *r = md->impl;
  nt_loader *test = r->test;
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
    if (!st) st = nt_model_read_scalar(ctx, nt_cnn_loss(r->m), &l);
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
    e->test_loss = seen ? lsum / (double)seen : NAN;
    e->accuracy = seen ? (double)correct / (double)seen : NAN;
  }
  return st;
}

static void write_config(nt_jw *w, const nt_model *md) {
  const cnn_run *r = md->impl;
  const nt_cnn_config *c = nt_cnn_get_config(r->m);
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
  nt_data_id_write(w, &r->data_id);
}

static nt_status start_epoch(nt_ctx *ctx, nt_model *md, uint64_t epoch, int64_t skip) {
  cnn_run *r = md->impl;
  nt_status st = nt_loader_set_epoch(r->train, epoch);
  for (int64_t k = 0; !st && k < skip; k++) {   /* resume mid-epoch */
    nt_batch b;
    bool end;
    st = nt_loader_next(r->train, &b, &end);
  }
  (void)ctx;
  nt_loader_reset_stats(r->train);
  r->waited_ns = 0;
  return st;
}

static nt_status next_batch(nt_ctx *ctx, nt_model *md, int64_t iter, nt_model_batch *out,
                            bool *end, double *wait_s) {
  cnn_run *r = md->impl;
  nt_batch b;
  (void)iter;   /* the loader's position is the epoch's */
  nt_status st = nt_model_loader_next(r->train, &r->waited_ns, &b, end, wait_s);
  if (st || *end) return st;
  out->size = b.size;
  return stage_batch(ctx, r, &b, &out->inputs, &out->targets);
}

static void cnn_free(nt_ctx *ctx, nt_model *md) {
  cnn_run *r = md->impl;
  nt_loader_free(r->train);
  nt_loader_free(r->test);
  nt_tensor_free(ctx, &r->x);
  nt_tensor_free(ctx, &r->y);
  nt_cnn_free(ctx, r->m);
  if (r->full_train) r->train_set.n = r->full_train;
  if (r->full_test) r->test_set.n = r->full_test;
  nt_image_set_free(&r->train_set);
  nt_image_set_free(&r->test_set);
  free(r);
}

static const nt_model_ops cnn_ops = {"cnn",       "images",    micro_step,   loss,
                                     evaluate,    start_epoch, next_batch,   write_config,
                                     NULL,        cnn_free};

nt_status nt_model_cnn_create(nt_ctx *ctx, const nt_train_options *o, const nt_policy *pol,
                              const nt_json *config, nt_model **out) {
  *out = NULL;
  cnn_run *r = calloc(1, sizeof *r);
  if (!r) return NT_ERROR(ctx, NT_ERR_OOM, "out of host memory for the CNN run");
  nt_model *md = &r->base;
  md->ops = &cnn_ops;
  md->impl = r;
  nt_cnn_config cfg = o->cnn;
  /* a resume's shape is in o already (train_checkpoint.c merges it); config is the
   * checkpoint's model_config, whose data must be these */
  nt_image_set *trs = &r->train_set, *tes = &r->test_set;
  nt_status st = nt_fashion_mnist_load(ctx, o->data_dir, true, trs);
  if (!st) st = nt_fashion_mnist_load(ctx, o->data_dir, false, tes);
  if (st) goto fail;
  uint64_t h = NT_FNV_OFFSET;
  for (int k = 0; k < 2; k++) {
    const nt_image_set *set = k ? tes : trs;
    h = nt_fnv1a(h, set->images.data, (size_t)set->images.numel);
    h = nt_fnv1a(h, set->labels, (size_t)set->n * sizeof *set->labels);
  }
  r->data_id = (nt_data_id){"fashion-mnist", trs->n + tes->n, h};
  if (config) st = nt_preflight_data(ctx, config, &r->data_id, o->data_dir);
  if (st) goto fail;
  r->full_train = trs->n;
  r->full_test = tes->n;
  if (o->train_subset > 0 && o->train_subset < trs->n) trs->n = o->train_subset;
  if (o->test_subset > 0 && o->test_subset < tes->n) tes->n = o->test_subset;
  cfg.height = (int)trs->h;
  cfg.width = (int)trs->w;
  cfg.in_channels = 1;
  cfg.classes = trs->num_classes;
  r->train_src = (nt_image_source){trs, false, {o->augment ? 2 : 0, o->augment, FASHION_MEAN,
                                                FASHION_STD}};
  r->test_src = (nt_image_source){tes, false, {0, false, FASHION_MEAN, FASHION_STD}};
  nt_dataset tr_ds = nt_image_dataset(&r->train_src), te_ds = nt_image_dataset(&r->test_src);
  int64_t B = o->batch_size;
  nt_dtype dt = pol->compute_dtype;
  nt_model_sizes sizes;
  st = nt_cnn_estimate(ctx, &cfg, dt, (int)B, &sizes);
  if (st) goto fail;
  /* memest's figures against free memory before anything large is allocated; on the host:
   * both loaders' slots (fp32 images and labels) */
  int64_t pixels = (int64_t)cfg.in_channels * cfg.height * cfg.width;
  nt_memest_compute(&sizes, dt, B, pixels, cfg.classes, o->dist.fsdp.strategy, o->world_size,
                    nt_ctx_is_cuda(ctx) ? NT_MEMEST_WORKSPACE_BYTES : 0, &md->estimate);
  st = nt_preflight_run_memory(ctx, &md->estimate, (double)B * (double)(pixels + 1) * 4 *
                                                       (2 * o->num_workers + 2) * 2);
  if (st) goto fail;
  nt_loader_opts lo = nt_loader_default_opts();
  lo.batch_size = B;
  lo.shuffle = true;
  lo.seed = o->seed;
  lo.drop_last = true;           /* fixed shapes: one CUDA graph for every step */
  lo.num_workers = o->num_workers;
  lo.rank = o->rank;
  lo.world_size = o->world_size;
  st = nt_loader_create(ctx, &tr_ds, &lo, &r->train);
  lo.shuffle = false;
  lo.drop_last = false;
  lo.rank = 0;                   /* every rank evaluates on the whole test set */
  lo.world_size = 1;
  if (!st) st = nt_loader_create(ctx, &te_ds, &lo, &r->test);
  if (!st) st = nt_cnn_create(ctx, &cfg, dt, (int)B, &r->m);
  if (!st) st = nt_params_init(ctx, nt_cnn_params(r->m), o->seed);
  if (!st && pol->fp8) st = nt_cnn_enable_fp8(ctx, r->m, false);
  /* the model's channels-last input [B, H, W, C]; the loader's one-channel [1, h, w] images
   * are the same memory */
  int64_t xs[4] = {B, cfg.height, cfg.width, cfg.in_channels};
  if (!st) st = nt_tensor_alloc(ctx, &r->x, dt, 4, xs);
  if (!st) st = nt_tensor_alloc(ctx, &r->y, NT_I32, 1, &B);
  if (st) goto fail;
  md->params = nt_cnn_params(r->m);
  md->compute = dt;
  md->items_per_step = B;
  md->flops_per_item = nt_cnn_flops_per_image(r->m);
  md->batches_per_epoch = nt_loader_num_batches(r->train);
  md->checkpoint_every_eval = true;
  int64_t steps = md->batches_per_epoch * o->epochs;
  if (o->max_iters > 0 && o->max_iters < steps) steps = o->max_iters;
  snprintf(md->summary, sizeof md->summary,
           "cnn: widths %d/%d, hidden %d, %.2fM parameters, %s on %s, batch %lld, %lld/%lld "
           "train/test images, %d epochs (%lld steps)", cfg.c1, cfg.c2, cfg.hidden,
           (double)md->params->n_real / 1e6, nt_precision_name(pol->precision),
           nt_ctx_is_cuda(ctx) ? "cuda" : "cpu", (long long)B, (long long)trs->n,
           (long long)tes->n, o->epochs, (long long)steps);
  *out = md;
  return NT_OK;
fail:
  cnn_free(ctx, md);
  return st;
}
