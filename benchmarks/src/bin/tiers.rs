//! Prints the CPU tiers this machine runs, lowest first (`generic avx2 avx512 amx` on a CPU
//! with AMX): the `ZOO_CPU` values `scripts/bench.sh` runs every benchmark at.

fn main() {
    let tiers: Vec<String> = zoo_runtime::cpu::features::tiers()
        .iter()
        .map(|t| t.to_string())
        .collect();
    println!("{}", tiers.join(" "));
}
