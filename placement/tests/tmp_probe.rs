mod common;
use common::*;
use placement::place;
#[test]
fn probe() {
    for n in [8usize, 16, 32, 64] {
    let rams: Vec<u64> = (0..n as u64).map(|i| (8 + (i * 7919) % 13) * 1000 * MB).collect();
    let total: u64 = rams.iter().sum();
    let nodes = numbered_nodes(&rams);
    for (name, edges) in [("mesh", full_mesh(&nodes)), ("ring", ring(&nodes)), ("two", two_switch(&nodes))] {
        let t = std::time::Instant::now();
        let p = place(&input(nodes.clone(), edges.clone(), model(200, total / 3), pipeline()));
        println!("{n} {name} {:?} {:?}", t.elapsed(), p.map(|p| p.ranks.len()).map_err(|e| e.code()));
    }}
}
