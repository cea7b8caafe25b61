//! `include/cachealloc.h` is generated from the C API by cbindgen (configuration in
//! `cbindgen.toml`) and committed. This test regenerates it and fails on any difference; run
//! `scripts/gen-header.sh` (or this test with `CACHEALLOC_UPDATE_HEADER=1`) to rewrite it.

use std::path::{Path, PathBuf};

/// The Rust files that make up the C API (the interposed `cuda*` functions are not part of it:
/// programs get those declarations from the CUDA headers).
const SOURCES: &[&str] = &["src/ffi/c_api.rs", "src/ffi/stats.rs", "src/ffi/torch.rs"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> Vec<u8> {
    let root = root();
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut builder = cbindgen::Builder::new().with_config(config);
    for source in SOURCES {
        builder = builder.with_src(root.join(source));
    }
    let bindings = builder.generate().expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    // cbindgen ends its C++ guards with `//` comments, which C89 does not have (gcc's
    // `-std=c89 -pedantic-errors` refuses them): the header is written in block comments only.
    String::from_utf8(out)
        .expect("cbindgen writes UTF-8")
        .replace("#endif // __cplusplus", "#endif /* __cplusplus */")
        .replace("#endif  // __cplusplus", "#endif  /* __cplusplus */")
        .replace("}  // extern \"C\"", "}  /* extern \"C\" */")
        .into_bytes()
}

#[test]
fn committed_header_matches_the_c_api() {
    let generated = generate();
    let path = root().join("include/cachealloc.h");
    if std::env::var_os("CACHEALLOC_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write include/cachealloc.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the C API in src/ffi; regenerate it with scripts/gen-header.sh \
         and commit the result",
        Path::new("include/cachealloc.h").display()
    );
}

#[test]
fn header_declares_the_whole_c_api() {
    let text = String::from_utf8(generate()).unwrap();
    for name in [
        "cachealloc_malloc",
        "cachealloc_free",
        "cachealloc_empty_cache",
        "cachealloc_get_stats",
        "cachealloc_stats_json",
        "cachealloc_reset_peak_stats",
        "cachealloc_reset_accumulated_stats",
        "cachealloc_version",
        "cachealloc_torch_malloc",
        "cachealloc_torch_free",
        "cachealloc_record_stream",
        "cachealloc_torch_record_stream",
        "cachealloc_torch_mempool_malloc",
        "cachealloc_torch_empty_cache",
        "cachealloc_torch_set_memory_fraction",
        "cachealloc_torch_base_alloc",
        "CacheallocStats",
        "CACHEALLOC_STATS_VERSION",
    ] {
        assert!(text.contains(name), "{name} missing from the header");
    }
    // Every code the C API answers of its own (`ffi::status::to_code`, and the panic boundary's
    // cudaErrorUnknown) is named, with what it means.
    for code in [
        "0 = cudaSuccess",
        "1 = cudaErrorInvalidValue",
        "2 = cudaErrorMemoryAllocation",
        "3 = cudaErrorInitializationError",
        "101 = cudaErrorInvalidDevice",
        "999 = cudaErrorUnknown",
    ] {
        assert!(text.contains(code), "{code} missing from the header");
    }
    assert!(text.contains("do not edit"));
    assert!(
        !text.contains("cudaMalloc("),
        "interposed runtime functions stay out"
    );
}

/// The header compiles without a warning in the strictest modes of every C and C++ standard a
/// program may use, C89 and C++98 included (it is generated: a cbindgen change could break it).
#[test]
fn header_compiles_as_strict_c89_to_c17_and_cxx98_to_cxx17() {
    let dir = std::env::temp_dir().join(format!("cachealloc-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("uses_header.c");
    std::fs::write(
        &source,
        "#include <cachealloc.h>\nint main(void) { CacheallocStats s; s.size = sizeof s; \
         return cachealloc_get_stats(0, &s) + (int)cachealloc_stats_json(0, 0, 0); }\n",
    )
    .unwrap();
    let include = root().join("include");
    for (compiler, language, standards) in [
        ("cc", "c", &["c89", "c99", "c11", "c17"][..]),
        ("c++", "c++", &["c++98", "c++11", "c++17"][..]),
    ] {
        for std in standards {
            let out = std::process::Command::new(compiler)
                .args(["-x", language, &format!("-std={std}")])
                .args([
                    "-pedantic-errors",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-fsyntax-only",
                ])
                .arg("-I")
                .arg(&include)
                .arg(&source)
                .output()
                .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
            assert!(
                out.status.success(),
                "the header does not compile as {std}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
