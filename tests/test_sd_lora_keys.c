// LoRA files' tensor names for SD 1.5's and 2.1's UNet and text encoder
// (models/sd_lora_keys.h): literal names of each format, as kohya, diffusers
// and PEFT write them (TRAINING.md's examples), resolve to the engine's
// parameters; every linear and convolution weight of the four parts, named in
// each format by that format's rule, resolves back to itself; no two modules
// collide once '.' is written '_'; and keys of no layer, of SDXL, of LyCORIS
// or of no format are refused with their names in the message.
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/error.h"
#include "models/clip_text.h"
#include "models/sd_lora_keys.h"
#include "models/unet.h"

// The weight name a LoRA key resolves to in ps, or a message.
static const char *resolve(const dc_lora_modules *t, const char *key, dc_lora_role *role, dc_lora_part *part) {
    dc_lora_key k;
    if (dc_lora_key_parse(key, &k)) return dc_error();
    if (role) *role = k.role;
    if (part) *part = k.part;
    const int i = dc_lora_modules_find(t, &k);
    return i < 0 ? dc_error() : t->ps->items[i].name;
}

static void expect(const dc_lora_modules *t, const char *key, const char *want, dc_lora_role role) {
    dc_lora_role r = DC_LORA_ALPHA;
    const char *got = resolve(t, key, &r, NULL);
    CHECK(!strcmp(got, want) && r == role, "%s -> %s (role %d), want %s (role %d)", key, got, r, want, role);
}

// Every weight of t named by each format's rule resolves to itself.
static void round_trip(const dc_lora_modules *t, bool unet, const char *what) {
    int bad = 0, n = 0;
    for (int m = 0; m < t->n; m++) {
        const char *name = t->ps->items[t->mods[m].param].name;
        char dotted[DC_PARAM_NAME_MAX], key[400];
        snprintf(dotted, sizeof dotted, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
        const char *forms[][2] = {
            {unet ? "lora_unet_%s.lora_down.weight" : "lora_te_text_model_%s.lora_down.weight", t->mods[m].under},
            {unet ? "lora_unet_%s.lora_up.weight" : "lora_te_text_model_%s.lora_up.weight", t->mods[m].under},
            {unet ? "lora_unet_%s.alpha" : "lora_te_text_model_%s.alpha", t->mods[m].under},
            {unet ? "unet.%s.lora.down.weight" : "text_encoder.text_model.%s.lora.down.weight", dotted},
            {unet ? "unet.%s.lora_B.weight" : "text_encoder.%s.lora_B.weight", dotted},
            {unet ? "unet.%s.lora_A.default.weight" : "text_encoder.%s.lora_A.default.weight", dotted}};
        for (size_t f = 0; f < sizeof forms / sizeof *forms; f++, n++) {
            snprintf(key, sizeof key, forms[f][0], forms[f][1]);
            const char *got = resolve(t, key, NULL, NULL);
            if (strcmp(got, name) && bad++ < 5) printf("  %s -> %s\n", key, got);
        }
    }
    printf("  %s: %d weights, %d names in six forms\n", what, t->n, n);
    CHECK(bad == 0 && t->n > 70, "%s: %d names resolve elsewhere", what, bad);
}

static void test_unet(const char *config, const char *what) {
    dc_unet_config c;
    dc_params ps = {0};
    dc_lora_modules t;
    if (dc_unet_config_from_json_file(&c, config) || dc_unet_register(&c, &ps) || dc_lora_modules_init(&t, &ps)) {
        CHECK(0, "%s: %s", what, dc_error());
        return dc_params_free(&ps);
    }
    round_trip(&t, true, what);
    const char *tb = "down_blocks.0.attentions.0.transformer_blocks.0";
    char want[200];
    snprintf(want, sizeof want, "%s.attn1.to_q.weight", tb);
    expect(&t, "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight", want,
           DC_LORA_DOWN);
    expect(&t, "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.processor.to_q_lora.up.weight", want,
           DC_LORA_UP);
    expect(&t, "lora_unet_up_blocks_3_attentions_2_transformer_blocks_0_attn2_to_out_0.lora_up.weight",
           "up_blocks.3.attentions.2.transformer_blocks.0.attn2.to_out.0.weight", DC_LORA_UP);
    expect(&t, "unet.up_blocks.3.attentions.2.transformer_blocks.0.attn2.processor.to_out_lora.down.weight",
           "up_blocks.3.attentions.2.transformer_blocks.0.attn2.to_out.0.weight", DC_LORA_DOWN);
    expect(&t, "lora_unet_mid_block_attentions_0_proj_in.alpha", "mid_block.attentions.0.proj_in.weight",
           DC_LORA_ALPHA);
    expect(&t, "lora_unet_up_blocks_1_attentions_2_transformer_blocks_0_ff_net_0_proj.lora_down.weight",
           "up_blocks.1.attentions.2.transformer_blocks.0.ff.net.0.proj.weight", DC_LORA_DOWN);
    expect(&t, "lora_unet_down_blocks_1_resnets_0_conv1.lora_down.weight", "down_blocks.1.resnets.0.conv1.weight",
           DC_LORA_DOWN);  // LoCon
    expect(&t, "unet.down_blocks.1.attentions.1.transformer_blocks.0.attn2.to_k.lora_A.weight",
           "down_blocks.1.attentions.1.transformer_blocks.0.attn2.to_k.weight", DC_LORA_DOWN);
    // LyCORIS's LoHa and LoKr tensors under kohya's names
    expect(&t, "lora_unet_down_blocks_1_resnets_0_conv1.hada_w2_b", "down_blocks.1.resnets.0.conv1.weight",
           DC_LORA_HADA_W2B);
    expect(&t, "lora_unet_down_blocks_1_resnets_0_conv1.lokr_w1", "down_blocks.1.resnets.0.conv1.weight",
           DC_LORA_LOKR_W1);
    expect(&t, "lora_unet_down_blocks_1_resnets_0_conv1.lokr_w2_a", "down_blocks.1.resnets.0.conv1.weight",
           DC_LORA_LOKR_W2A);
    // refused, with the key named
    const char *bad[][2] = {{"lora_unet_down_blocks_9_attentions_0_proj_in.lora_down.weight", "down_blocks_9"},
                            {"unet.down_blocks.0.attentions.0.no_such.lora.up.weight", "no_such"},
                            {"lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_up.weight", "SDXL"},
                            {"lora_unet_down_blocks_0_resnets_0_conv1.hada_t1", "Tucker"},
                            {"lora_unet_down_blocks_0_resnets_0_conv1.lokr_t2", "Tucker"},
                            {"lora_unet_down_blocks_0_resnets_0_conv1.lora_left.weight", "lora_left"},
                            {"model.diffusion_model.input_blocks.1.1.proj_in.weight", "input_blocks"},
                            {"unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.processor.to_x_lora.up.weight",
                             "to_x_lora"},
                            // a norm's weight is 1-D: no LoRA goes there
                            {"unet.down_blocks.0.attentions.0.norm.lora.up.weight", "norm"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *got = resolve(&t, bad[i][0], NULL, NULL);
        // a message (every one starts "LoRA"; no parameter's name does) that names what is wrong
        CHECK(!strncmp(got, "LoRA", 4) && strstr(got, bad[i][1]), "%s: refused with '%s'", bad[i][0], got);
    }
    dc_lora_modules_free(&t);
    dc_params_free(&ps);
}

static void test_text(const dc_clip_text_config *c, const char *what) {
    dc_params ps = {0};
    dc_lora_modules t;
    if (dc_clip_text_params(&ps, c) || dc_lora_modules_init(&t, &ps)) {
        CHECK(0, "%s: %s", what, dc_error());
        return dc_params_free(&ps);
    }
    round_trip(&t, false, what);
    expect(&t, "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight",
           "encoder.layers.0.self_attn.q_proj.weight", DC_LORA_DOWN);
    expect(&t, "text_encoder.text_model.encoder.layers.11.mlp.fc2.lora.up.weight", "encoder.layers.11.mlp.fc2.weight",
           DC_LORA_UP);
    expect(&t, "text_encoder.encoder.layers.3.self_attn.out_proj.lora_B.weight",
           "encoder.layers.3.self_attn.out_proj.weight", DC_LORA_UP);
    const char *got = resolve(&t, "lora_te_encoder_layers_0_self_attn_q_proj.lora_down.weight", NULL, NULL);
    CHECK(strstr(got, "lora_te_text_model_") != NULL, "a kohya text key without text_model_: '%s'", got);
    got = resolve(&t, "lora_te_text_model_encoder_layers_40_mlp_fc1.lora_up.weight", NULL, NULL);
    CHECK(strstr(got, "encoder_layers_40") != NULL, "a layer the encoder lacks: '%s'", got);
    dc_lora_modules_free(&t);
    dc_params_free(&ps);
}

// Two weights that read the same with '_' for '.' make kohya's names ambiguous: refused.
static void test_collision(void) {
    dc_params ps = {0};
    dc_lora_modules t;
    const int ok = dc_params_add(&ps, "blocks.a_b.proj.weight", true, 2, 4, 4) >= 0 &&
                   dc_params_add(&ps, "blocks.a.b_proj.weight", true, 2, 4, 4) >= 0;
    CHECK(ok && dc_lora_modules_init(&t, &ps) != 0 && strstr(dc_error(), "blocks.a_b.proj.weight") &&
              strstr(dc_error(), "blocks.a.b_proj.weight"),
          "colliding underscored names: '%s'", dc_error());
    dc_params_free(&ps);
}

int main(void) {
    test_collision();
    printf("SD 1.5\n");
    test_unet("tools/configs/sd15_unet.json", "SD 1.5 UNet");
    const dc_clip_text_config l14 = {49408, 77, 768, 12, 12, 3072, DC_ACT_QUICK_GELU, 1e-5f};
    test_text(&l14, "SD 1.5 text encoder");
    printf("SD 2.1\n");
    test_unet("tools/configs/sd21_unet.json", "SD 2.1 UNet");
    const dc_clip_text_config h14 = {49408, 77, 1024, 23, 16, 4096, DC_ACT_GELU_ERF, 1e-5f};
    test_text(&h14, "SD 2.1 text encoder");
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
