#include "rpg/core/config.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace rpg {
namespace {

struct Inner {
  double lr = 1e-6;
  std::vector<double> betas = {0.9, 0.999};
  template <class V>
  void visit(V& v) {
    v("lr", lr, "learning rate");
    v("betas", betas, "Adam betas");
  }
};

struct Outer {
  int64_t batch = 8;
  bool shuffle = true;
  std::string name = "run";
  std::optional<int64_t> seed;
  std::vector<std::string> files;
  Inner optim;
  template <class V>
  void visit(V& v) {
    v("batch", batch, "rows");
    v("shuffle", shuffle, "shuffle");
    v("name", name, "name");
    v("seed", seed, "seed");
    v("files", files, "files");
    v.section("optim", optim);
    v.ignored("fsdp_config", "plumbing");
  }
  void validate() const {
    if (batch <= 0) throw ConfigError(str("batch: must be > 0, got ", batch));
  }
};

Outer load(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  ConfigNode root = parse_yaml(yaml, "test.yaml");
  for (const auto& o : overrides) apply_override(root, o);
  return bind_config<Outer>(root).value;
}

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    load(yaml, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Config, DefaultsWhenEmpty) {
  Outer o = load("");
  EXPECT_EQ(o.batch, 8);
  EXPECT_TRUE(o.shuffle);
  EXPECT_EQ(o.name, "run");
  EXPECT_FALSE(o.seed.has_value());
  EXPECT_DOUBLE_EQ(o.optim.lr, 1e-6);
}

TEST(Config, ReadsNestedValuesOfEveryType) {
  Outer o = load(
      "batch: 32\nshuffle: false\nname: exp1\nseed: 7\nfiles: [a.parquet, b.parquet]\n"
      "optim:\n  lr: 3.0e-7\n  betas: [0.8, 0.95]\n");
  EXPECT_EQ(o.batch, 32);
  EXPECT_FALSE(o.shuffle);
  EXPECT_EQ(o.name, "exp1");
  ASSERT_TRUE(o.seed.has_value());
  EXPECT_EQ(*o.seed, 7);
  EXPECT_EQ(o.files, (std::vector<std::string>{"a.parquet", "b.parquet"}));
  EXPECT_DOUBLE_EQ(o.optim.lr, 3.0e-7);
  EXPECT_EQ(o.optim.betas, (std::vector<double>{0.8, 0.95}));
}

TEST(Config, OverridesNestedKeysInOrder) {
  Outer o = load("optim:\n  lr: 1.0e-6\n", {"optim.lr=5e-7", "batch=64", "batch=128", "seed=null",
                                           "+name=abc", "files=/data/train.parquet"});
  EXPECT_DOUBLE_EQ(o.optim.lr, 5e-7);
  EXPECT_EQ(o.batch, 128);
  EXPECT_EQ(o.name, "abc");
  EXPECT_EQ(o.files, (std::vector<std::string>{"/data/train.parquet"}));
  Outer p = load("seed: 3\n", {"seed=null"});
  EXPECT_FALSE(p.seed.has_value());
}

TEST(Config, OverrideCreatesMissingSections) {
  Outer o = load("", {"optim.betas=[0.5, 0.6]"});
  EXPECT_EQ(o.optim.betas, (std::vector<double>{0.5, 0.6}));
}

TEST(Config, DeleteOverrideRestoresDefault) {
  Outer o = load("batch: 3\n", {"~batch"});
  EXPECT_EQ(o.batch, 8);
  EXPECT_NE(error_of("", {"~optim.lr"}).find("no key 'optim.lr' to delete"), std::string::npos);
}

TEST(Config, IntegerAcceptsExactFloatLiteral) {
  EXPECT_EQ(load("batch: 1e3\n").batch, 1000);
  EXPECT_NE(error_of("batch: 1.5\n").find("batch: expected an integer, got '1.5'"), std::string::npos);
}

TEST(Config, UnknownKeySuggestsNearest) {
  std::string e = error_of("optim:\n  lrr: 1.0\n");
  EXPECT_NE(e.find("unknown key 'optim.lrr'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optim.lr'"), std::string::npos) << e;
  EXPECT_NE(e.find("test.yaml:2:"), std::string::npos) << e;
  // A key in the wrong section is found by its last component.
  std::string f = error_of("lr: 1.0\n");
  EXPECT_NE(f.find("did you mean 'optim.lr'"), std::string::npos) << f;
  // Nothing close: no suggestion.
  std::string g = error_of("completely_unrelated: 1\n");
  EXPECT_NE(g.find("unknown key 'completely_unrelated'"), std::string::npos) << g;
  EXPECT_EQ(g.find("did you mean"), std::string::npos) << g;
}

TEST(Config, UnknownKeyFromOverrideNamesTheOverride) {
  std::string e = error_of("", {"optim.betaz=[1,2]"});
  EXPECT_NE(e.find("override 'optim.betaz=[1,2]'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optim.betas'"), std::string::npos) << e;
}

TEST(Config, TypeErrorsNameKeyAndExpectedType) {
  EXPECT_NE(error_of("batch: many\n").find("test.yaml:1:8: batch: expected an integer, got 'many'"), std::string::npos)
      << error_of("batch: many\n");
  EXPECT_NE(error_of("shuffle: 3\n").find("shuffle: expected a boolean"), std::string::npos);
  EXPECT_NE(error_of("optim: 3\n").find("optim: expected a mapping"), std::string::npos);
  EXPECT_NE(error_of("optim:\n  lr: [1]\n").find("optim.lr: expected a finite number, got a list"), std::string::npos);
  EXPECT_NE(error_of("optim:\n  lr: .nan\n").find("optim.lr: expected a finite number"), std::string::npos);
  EXPECT_NE(error_of("batch: \"3\"\n").find("batch: expected an integer"), std::string::npos);
  EXPECT_NE(error_of("optim:\n  betas: [0.9, x]\n").find("optim.betas[1]: expected a finite number"),
            std::string::npos);
  EXPECT_NE(error_of("batch: 99999999999999999999999\n").find("batch: expected an integer in range"),
            std::string::npos);
}

TEST(Config, MalformedYamlIsConfigErrorWithPosition) {
  std::string e = error_of("batch: [1, 2\nname: x\n");
  EXPECT_NE(e.find("test.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("malformed YAML"), std::string::npos) << e;
  EXPECT_NE(error_of("- a\n- b\n").find("top level must be a mapping"), std::string::npos);
  EXPECT_NE(error_of("a: 1\na: 2\n").find("duplicate key 'a'"), std::string::npos);
}

TEST(Config, MalformedOverride) {
  EXPECT_NE(error_of("", {"batch"}).find("expected key=value"), std::string::npos);
  EXPECT_NE(error_of("", {"optim..lr=1"}).find("empty key component"), std::string::npos);
  EXPECT_NE(error_of("", {"batch.x=1"}).find("batch: expected an integer, got a mapping"), std::string::npos);
  EXPECT_NE(error_of("batch: 1\n", {"batch.x=1"}).find("'batch' is a value, not a mapping"), std::string::npos);
}

TEST(Config, IgnoredKeysAreAcceptedWithANotice) {
  ConfigNode root = parse_yaml("fsdp_config:\n  param_offload: true\n", "t.yaml");
  auto loaded = bind_config<Outer>(root);
  ASSERT_EQ(loaded.notices.size(), 1u);
  EXPECT_NE(loaded.notices[0].find("fsdp_config has no effect"), std::string::npos);
}

TEST(Config, ValidateIsCalled) {
  EXPECT_NE(error_of("batch: 0\n").find("batch: must be > 0, got 0"), std::string::npos);
}

TEST(Config, PrintedYamlLoadsBackToTheSameValues) {
  Outer o = load("name: 'true'\nseed: 5\nfiles: [x]\noptim:\n  lr: 0.1\n");
  std::string yaml = config_to_yaml(o);
  Outer back = load(yaml);
  EXPECT_EQ(back.name, "true");
  EXPECT_EQ(back.seed, o.seed);
  EXPECT_EQ(back.files, o.files);
  EXPECT_DOUBLE_EQ(back.optim.lr, 0.1);
  EXPECT_EQ(config_to_yaml(back), yaml);
}

TEST(Config, FileErrorsNameThePath) {
  try {
    load_yaml_file("/nonexistent/dir/config.yaml");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/config.yaml"), std::string::npos);
  }
  test::TempDir dir;
  test::write_text(dir / "bad.yaml", "a: [\n");
  try {
    load_yaml_file(dir / "bad.yaml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml:"), std::string::npos) << e.what();
  }
}

TEST(Config, EditDistanceAndNearest) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(nearest("clip_ratio_hgh", {"clip_ratio_low", "clip_ratio_high", "grad_clip"}), "clip_ratio_high");
  EXPECT_EQ(nearest("zzzzzz", {"clip_ratio_low", "grad_clip"}), "");
}

}  // namespace
}  // namespace rpg
