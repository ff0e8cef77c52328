// Commit cost of an append log (write + fdatasync) versus redb (one
// transaction per batch) for batches of 1 to 256 lease records.
// Usage: cargo run --release -- DIR   (DIR on the disk the lease file will use)
use std::io::Write;
use std::time::Instant;
use redb::{Database, TableDefinition};
const T: TableDefinition<u32, &[u8]> = TableDefinition::new("leases");
fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "store-choice-data".into());
    std::fs::create_dir_all(&dir).unwrap();
    let rec = br#"{"ip":"10.250.12.34","client":"01:02:00:00:00:12:34","hw":"02:00:00:00:12:34","state":"active","expires":1763770000,"hostname":"worker-17"}"#;
    for batch in [1usize, 8, 64, 256] {
        let commits = if batch == 1 { 2000 } else { 20000 / batch }.max(100);
        // append log
        let p = format!("{dir}/log.jsonl");
        let _ = std::fs::remove_file(&p);
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p).unwrap();
        let mut buf = Vec::new();
        let t = Instant::now();
        for c in 0..commits {
            buf.clear();
            for _ in 0..batch { buf.extend_from_slice(rec); buf.push(b'\n'); }
            f.write_all(&buf).unwrap(); f.sync_data().unwrap();
            let _ = c;
        }
        let log = t.elapsed().as_secs_f64();
        // redb
        let p = format!("{dir}/db.redb");
        let _ = std::fs::remove_file(&p);
        let db = Database::create(&p).unwrap();
        let t = Instant::now();
        let mut key = 0u32;
        for _ in 0..commits {
            let tx = db.begin_write().unwrap();
            { let mut tb = tx.open_table(T).unwrap();
              for _ in 0..batch { tb.insert(key % 100_000, rec.as_slice()).unwrap(); key += 1; } }
            tx.commit().unwrap();
        }
        let rd = t.elapsed().as_secs_f64();
        println!("batch {batch:>3}: commits {commits:>5}  append-log {:>8.1} us/commit {:>9.0} rec/s | redb {:>8.1} us/commit {:>9.0} rec/s | redb/log cost {:.2}x",
            log / commits as f64 * 1e6, (commits * batch) as f64 / log,
            rd / commits as f64 * 1e6, (commits * batch) as f64 / rd, rd / log);
    }
}
