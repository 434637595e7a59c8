//! Blends, per-split data paths and the index cache end to end, on small datasets written
//! with the builder into temporary directories.

use megatron_core::{Dataset, Sample};
use megatron_datasets::blended::blending_indices;
use megatron_datasets::gpt::builder::BuiltSplit;
use megatron_datasets::npy::read_npy;
use megatron_datasets::{Blend, CachePolicy, CacheStatus, GptBuilder, IndexedDatasetBuilder, TokenDType};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

/// Documents of the given lengths; token `p` of document `d` is `base + 100*d + p`.
fn write_docs(prefix: &Path, sizes: &[usize], base: u32) -> anyhow::Result<()> {
    let mut w = IndexedDatasetBuilder::create(prefix, TokenDType::I32)?;
    for (d, &n) in sizes.iter().enumerate() {
        let doc: Vec<u32> = (0..n as u32).map(|p| base + 100 * d as u32 + p).collect();
        w.add_item(&doc)?;
        w.end_document();
    }
    w.finalize()
}

fn sizes() -> Vec<usize> {
    (0..40).map(|d| 2 + (d * 5) % 11).collect()
}

/// Two datasets A (tokens < 10000) and B (tokens >= 10000).
fn two_datasets(dir: &Path) -> anyhow::Result<(String, String)> {
    let (a, b) = (dir.join("A_text_document"), dir.join("B_text_document"));
    write_docs(&a, &sizes(), 0)?;
    write_docs(&b, &sizes(), 10_000)?;
    Ok((a.to_string_lossy().into_owned(), b.to_string_lossy().into_owned()))
}

fn builder(words: &str, cache: CachePolicy, sizes: [Option<u64>; 3]) -> anyhow::Result<GptBuilder> {
    let blend = Blend::parse(&[words.to_string()])?.ok_or_else(|| anyhow::anyhow!("empty blend"))?;
    let mut b = GptBuilder::new(blend, Some("8,2,0".into()), 5, 1234, sizes);
    b.cache = cache;
    Ok(b)
}

fn all(d: &dyn Dataset) -> anyhow::Result<Vec<Sample>> {
    (0..d.len()).map(|i| d.get(i)).collect()
}

fn gpt(s: &Option<BuiltSplit>) -> anyhow::Result<&megatron_datasets::GptDataset> {
    match s {
        Some(BuiltSplit::Gpt(d)) => Ok(d),
        _ => anyhow::bail!("expected a GPT split"),
    }
}

fn blend(s: &Option<BuiltSplit>) -> anyhow::Result<&megatron_datasets::BlendedDataset> {
    match s {
        Some(BuiltSplit::Blend(d)) => Ok(d),
        _ => anyhow::bail!("expected a blended split"),
    }
}

fn files_in(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut v: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    v.sort();
    Ok(v)
}

#[test]
fn weighted_blend_interleaves_components_by_the_greedy_rule() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, b) = two_datasets(dir.path())?;
    let cache = dir.path().join("cache");
    let built =
        builder(&format!("0.3 {a} 0.7 {b}"), CachePolicy::Dir(cache.clone()), [Some(50), Some(7), None])?.build()?;
    let train = blend(&built[0])?;
    // ceil(50 * 0.3) + ceil(50 * 0.7) = 15 + 35.
    assert_eq!(train.len(), 50);
    let w = megatron_datasets::blend::normalize(&megatron_datasets::blend::normalize(&[0.3, 0.7]));
    assert_eq!(train.indices(), &blending_indices(&w, 50));
    // Components were built with the 0.5% surplus: ceil(ceil(50 * 0.3) * 1.005) = 16 requested.
    let comps = train.datasets();
    assert!(comps[0].len() >= 16 && comps[1].len() >= 36);
    for (t, s) in all(train)?.iter().enumerate() {
        let (d, k) = (train.indices().dataset_index[t] as usize, train.indices().dataset_sample_index[t] as usize);
        assert_eq!(s, &comps[d].get(k)?, "position {t}");
        assert_eq!(s.tokens[0] >= 10_000, d == 1, "tokens come from the right dataset");
    }
    assert_eq!(blend(&built[1])?.len(), 3 + 5);
    assert!(built[2].is_none());
    // With --data-cache-path the blend is cached too, named by the md5 of its description.
    let names = files_in(&cache)?;
    let base = format!("{}-BlendedDataset-train", train.hash());
    for affix in ["description.txt", "dataset_index.npy", "dataset_sample_index.npy"] {
        assert!(names.contains(&format!("{base}-{affix}")), "{base}-{affix} missing from {names:?}");
    }
    let di = read_npy(&cache.join(format!("{base}-dataset_index.npy")))?;
    assert_eq!(di.data, train.indices().dataset_index.iter().map(|&d| i64::from(d)).collect::<Vec<_>>());
    assert!(train.description().contains("\"weights\": [\n        0.3,\n        0.7\n    ],\n    \"size\": 50\n}"));
    let again = builder(&format!("0.3 {a} 0.7 {b}"), CachePolicy::Dir(cache), [Some(50), Some(7), None])?.build()?;
    assert_eq!(blend(&again[0])?.cache_status(), CacheStatus::Hit);
    Ok(())
}

#[test]
fn unweighted_blends_use_lengths_and_exhaust_without_sizes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, b) = two_datasets(dir.path())?;
    let sized = builder(&format!("{a} {b}"), CachePolicy::InMemory, [Some(10), None, None])?.build()?;
    let t = blend(&sized[0])?;
    assert_eq!(t.len(), 10, "min(size, sum of lengths)");
    let [la, lb] = [t.datasets()[0].len(), t.datasets()[1].len()];
    assert_eq!(la, lb, "same data, same one-epoch length");
    let exhaustive = blend(&sized[1])?;
    let [va, vb] = [exhaustive.datasets()[0].len(), exhaustive.datasets()[1].len()];
    assert_eq!(exhaustive.len(), va + vb);
    assert!(exhaustive.description().contains("\"size\": null"));
    // One weighted prefix is still a blend (of one); one plain prefix is not.
    assert!(matches!(
        builder(&format!("1 {a}"), CachePolicy::InMemory, [Some(4), Some(1), None])?.build()?[0],
        Some(BuiltSplit::Blend(_))
    ));
    assert!(matches!(
        builder(&a, CachePolicy::InMemory, [Some(4), Some(1), None])?.build()?[0],
        Some(BuiltSplit::Gpt(_))
    ));
    Ok(())
}

#[test]
fn cache_is_reused_rebuilt_when_corrupt_and_keyed_by_the_seed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, _) = two_datasets(dir.path())?;
    let sizes = [Some(30), Some(4), None];
    // Default location: next to the data.
    let first = builder(&a, CachePolicy::NextToData, sizes)?.build()?;
    let cache = Path::new(&a).join("cache").join("GPTDataset_indices");
    assert_eq!(gpt(&first[0])?.cache_status(), CacheStatus::Built);
    assert_eq!(files_in(&cache)?.len(), 8, "four files per split");
    let second = builder(&a, CachePolicy::NextToData, sizes)?.build()?;
    assert_eq!(gpt(&second[0])?.cache_status(), CacheStatus::Hit);
    assert_eq!(gpt(&second[1])?.cache_status(), CacheStatus::Hit);
    assert_eq!(gpt(&second[0])?.indices(), gpt(&first[0])?.indices());
    assert_eq!(all(gpt(&second[0])?)?, all(gpt(&first[0])?)?);

    // Truncate the shuffle index: logged, rebuilt, same content.
    let shuffle: PathBuf = files_in(&cache)?
        .into_iter()
        .find(|n| n.ends_with("-train-shuffle_index.npy"))
        .map(|n| cache.join(n))
        .ok_or_else(|| anyhow::anyhow!("no train shuffle index"))?;
    let bytes = std::fs::read(&shuffle)?;
    std::fs::write(&shuffle, &bytes[..bytes.len() - 4])?;
    let third = builder(&a, CachePolicy::NextToData, sizes)?.build()?;
    assert_eq!(gpt(&third[0])?.cache_status(), CacheStatus::Built);
    assert_eq!(gpt(&third[1])?.cache_status(), CacheStatus::Hit);
    assert_eq!(std::fs::read(&shuffle)?, bytes);

    // Another seed is another description, so another hash and other files.
    let mut other = builder(&a, CachePolicy::NextToData, sizes)?;
    other.seed = 99;
    let built = other.build()?;
    assert_eq!(gpt(&built[0])?.cache_status(), CacheStatus::Built);
    assert_eq!(files_in(&cache)?.len(), 16);
    assert_ne!(gpt(&built[0])?.indices().shuffle_index, gpt(&first[0])?.indices().shuffle_index);
    Ok(())
}

#[test]
fn four_threads_build_once_and_read_the_same_indices() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, _) = two_datasets(dir.path())?;
    let cache = dir.path().join("shared_cache");
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (a, cache, barrier) = (a.clone(), cache.clone(), barrier.clone());
            std::thread::spawn(move || -> anyhow::Result<_> {
                let b = builder(&a, CachePolicy::Dir(cache), [Some(200), Some(20), None])?;
                barrier.wait();
                let built = b.build()?;
                Ok((gpt(&built[0])?.cache_status(), gpt(&built[0])?.indices().clone()))
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().map_err(|_| anyhow::anyhow!("thread panicked"))?)
        .collect::<anyhow::Result<_>>()?;
    let built = results.iter().filter(|r| r.0 == CacheStatus::Built).count();
    assert_eq!(built, 1, "exactly one thread builds: {:?}", results.iter().map(|r| r.0).collect::<Vec<_>>());
    assert!(results.iter().all(|r| r.1 == results[0].1));
    assert!(!files_in(&cache)?.iter().any(|n| n.ends_with(".lock") || n.contains(".tmp.")));
    Ok(())
}

#[test]
fn per_split_paths_use_whole_prefixes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, b) = two_datasets(dir.path())?;
    let parse = |s: &str| Blend::parse(&[s.to_string()]);
    let mut pb = builder(&a, CachePolicy::Dir(dir.path().join("c")), [None, Some(6), None])?;
    pb.blend = None;
    pb.split = None;
    pb.blend_per_split = [parse(&a)?, parse(&b)?, parse(&format!("{a} {b}"))?];
    let built = pb.build()?;
    let train = gpt(&built[0])?;
    // Every sequence of A is in the (one-epoch) train split.
    let mut docs = train.indices().document_index.clone();
    docs.sort();
    assert_eq!(docs, (0..40).collect::<Vec<i32>>());
    assert!(train.description().is_some_and(|d| {
        let t = d.dumps_indent4();
        t.contains("\"split\": null") && t.contains("\"split_matrix\": null")
    }));
    assert!(all(gpt(&built[1])?)?.iter().all(|s| s.tokens[0] >= 10_000));
    assert_eq!(blend(&built[2])?.datasets().len(), 2);
    // --split with per-split paths, or both kinds of paths, are errors.
    pb.split = Some("1,1,1".into());
    assert!(pb.build().is_err());
    pb.split = None;
    pb.blend = parse(&a)?;
    assert!(pb.build().is_err());
    Ok(())
}

#[test]
fn description_is_pythons_json_and_names_the_files() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let prefix = dir.path().join("D_text_document");
    write_docs(&prefix, &sizes(), 0)?;
    let p = prefix.to_string_lossy().into_owned();
    let cache = dir.path().join("cache");
    let mut b = builder(&p, CachePolicy::Dir(cache.clone()), [Some(30), Some(4), Some(2)])?;
    b.split = None; // the legacy default "969, 30, 1"
    b.tokenizer = megatron_datasets::TokenizerDescription::legacy_for_megatron_type(
        "GPT2BPETokenizer",
        Some("gpt2-vocab.json"),
        Some("gpt2-merges.txt"),
        None,
    );
    let built = b.build()?;
    let want = format!(
        "{{\n    \"class\": \"GPTDataset\",\n    \"dataset_path\": \"{p}\",\n    \"num_samples\": 30,\n    \
         \"index_split\": \"train\",\n    \"random_seed\": 1234,\n    \"sequence_length\": 5,\n    \
         \"split\": \"969, 30, 1\",\n    \"split_matrix\": [\n        [\n            0,\n            0.969\n        \
         ],\n        [\n            0.969,\n            0.999\n        ],\n        [\n            0.999,\n            \
         1.0\n        ]\n    ],\n    \"tokenizer\": {{\n        \"class\": \"_GPT2BPETokenizer\",\n        \
         \"tokenizer_path\": [\n            \"gpt2-vocab.json\",\n            \"gpt2-merges.txt\"\n        ]\n    \
         }}\n}}"
    );
    let got = gpt(&built[0])?.description().map(|d| d.dumps_indent4()).unwrap_or_default();
    assert_eq!(got, want);
    let hash = megatron_datasets::md5::md5_hex(want.as_bytes());
    let desc_file = cache.join(format!("{hash}-GPTDataset-train-description.txt"));
    assert_eq!(std::fs::read_to_string(desc_file)?, want);
    Ok(())
}

/// Issue 10: the current (Megatron-LM main) tokenizer description names new caches; caches
/// written under the legacy name are still read, not rebuilt beside them.
#[test]
fn current_tokenizer_description_names_caches_and_legacy_caches_are_reused() -> anyhow::Result<()> {
    use megatron_datasets::cache::CacheStatus;
    use megatron_datasets::TokenizerDescription;
    let dir = tempfile::tempdir()?;
    let prefix = dir.path().join("D_text_document");
    write_docs(&prefix, &sizes(), 0)?;
    let p = prefix.to_string_lossy().into_owned();
    let args = ("GPT2BPETokenizer", Some("gpt2-vocab.json"), Some("gpt2-merges.txt"), None);
    let files = |d: &std::path::Path| -> anyhow::Result<Vec<String>> {
        let mut v: Vec<String> = std::fs::read_dir(d)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        v.sort();
        Ok(v)
    };
    // A cache written under the legacy name ...
    let old_cache = dir.path().join("old");
    let mut b = builder(&p, CachePolicy::Dir(old_cache.clone()), [Some(30), Some(4), Some(2)])?;
    b.tokenizer = TokenizerDescription::legacy_for_megatron_type(args.0, args.1, args.2, args.3);
    let first = b.build()?;
    assert_eq!(gpt(&first[0])?.cache_status(), CacheStatus::Built);
    let before = files(&old_cache)?;
    // ... is read by a build described with the current form, which writes nothing new.
    b.tokenizer = TokenizerDescription::for_megatron_type(args.0, args.1, args.2, args.3);
    let again = b.build()?;
    assert_eq!(gpt(&again[0])?.cache_status(), CacheStatus::Hit);
    assert_eq!(files(&old_cache)?, before);
    assert_eq!(all(gpt(&again[0])?)?, all(gpt(&first[0])?)?);
    // A fresh cache is named by the current form (its text holds Megatron main's class).
    let new_cache = dir.path().join("new");
    b.cache = CachePolicy::Dir(new_cache.clone());
    let fresh = b.build()?;
    assert_eq!(gpt(&fresh[0])?.cache_status(), CacheStatus::Built);
    let text = gpt(&fresh[0])?.description().map(|d| d.dumps_indent4()).unwrap_or_default();
    assert!(text.contains("megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText"), "{text}");
    let hash = megatron_datasets::md5::md5_hex(text.as_bytes());
    assert!(new_cache.join(format!("{hash}-GPTDataset-train-description.txt")).is_file());
    assert!(files(&new_cache)?.iter().all(|f| !before.contains(f)), "{:?}", files(&new_cache)?);
    Ok(())
}
